
Â
kubeadm-join1.33-1u
$/etc/kubernetes/lks/kubeadm-join.envGsha256:53c55c62e57962e2daa88cbb0e06c2ab04750a9f3c7d185b6cdf42f40f555c54Ú	 €p
/usr/local/bin/lks-kubeadm-joinGsha256:c4921d7af84cc8c0d6fc9c1abaf4f7ac7b24deaf904da0565ca9666840465bd0× í"}
9render /etc/kubernetes/kubeadm-join.yaml and kubeadm join/bin/sh-c/exec "$LKS_ROOT/usr/local/bin/lks-kubeadm-join"ÀÏ$*B
curl
-sf

--max-time
3
http://127.0.0.1:10248/healthzˆ' ˆ'@F<0hÿ%ÚÉä‹Ø?*næ'´Í±ðŒa…`Þ‚ I|ÜL´Û&ÑÇB
•ó	;«êÕò‚pz·{÷7Zñ Š¢7µ$§®¥ßöbŒ£ªˆ}ÜV7{¶[‚^½ë

¼
kubelet-node-identity1
?/etc/systemd/system/kubelet.service.d/30-lks-node-identity.confGsha256:2913524081abafbfb89d05933c9437aed194333a2e5b5295ae868fdea8d00dbcî ¤s
"/usr/local/bin/lks-kubelet-restartGsha256:6f382c64a175e279c47b9145b5eb7331ba886b4ad9c9d747675d42a7436c90b8² í"O
%restart kubelet with its new identity"/usr/local/bin/lks-kubelet-restartÀ©2„
'/var/lib/kubelet/pki/kubelet-client.crt'/var/lib/kubelet/pki/kubelet-client.keykubelet-client@€ûÓ	J/etc/kubernetes/pki/ca.crt2w
 /var/lib/kubelet/pki/kubelet.crt /var/lib/kubelet/pki/kubelet.keykubelet-serving@€ûÓ	J/etc/kubernetes/pki/ca.crt:G
/etc/kubernetes/kubelet.conf'/var/lib/kubelet/pki/kubelet-client.crt@ö
eãÆàÎğUÉŸ%mŒ
»–±5Ü›nUÕ*Êé£{È†@Êª*nišúîãpLËï“ZdöïGœSç Š¢7µ$§®¥ßöbŒ£ªˆ}ÜV7{¶[‚^½ë
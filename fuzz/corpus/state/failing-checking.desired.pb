¢
ü
app2_
/etc/app/a.confGsha256:1c5997ee558564f5360571a5b6ede6d923e1c5d09c2863a6bde0b5df0fb909f4 †Z

/usr/bin/cGsha256:5209e879e4a8772678a7fcab4438e2fc621332cbe85de794ecffbaa7733c2e99 Ì"?
notesh-c,echo "$LKS_VERSION" >> "$LKS_ROOT/steps.log"êN*
sh
-c
exit 1à' 

ß
§
app1_
/etc/app/a.confGsha256:7cc458c65d9b543e71f7d8e62b00615652b77f6c0a0c8208d36a4e9d45744eae( §_
/etc/app/b.confGsha256:37b5a1b3f7852290d0b1fdf00b3656d4ab9c4cd4cb02af2259b645767948ee5d Ä"?
notesh-c,echo "$LKS_VERSION" >> "$LKS_ROOT/steps.log"êN*
sh
-c
exit 0à' 

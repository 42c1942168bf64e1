/* The pause process of the test node image's sandbox ("pause") image
 * (tests/vm/real-node.sh builds it static and packs it with pause-image.py):
 * holds a pod's namespaces, reaps orphans, exits on SIGINT or SIGTERM. The
 * VM cannot pull registry.k8s.io/pause, so the test builds its own. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, quit);
  signal(SIGTERM, quit);
  signal(SIGCHLD, reap);
  for (;;) pause();
}

/*
 * A fake lksadmin-agent for tests/vm/self-update.sh: a real ELF executable
 * for this machine that answers `version` like the agent (so the running
 * agent accepts it as a self-update), then misbehaves under systemd in the
 * way the build chose:
 *
 *   cc -DFAKE_VERSION='"0.1.0+bad"' -DFAKE_EXIT       exits 1 at start
 *   cc -DFAKE_VERSION='"0.1.0+bad"' -DFAKE_HANG       never sends READY=1
 *   cc -DFAKE_VERSION='"0.1.0+bad"' -DFAKE_NO_CONNECT READY=1 and watchdog
 *                                                     pings, never connects
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef FAKE_VERSION
#error "build with -DFAKE_VERSION='\"X\"'"
#endif

/* sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET, a path or
 * (leading '@') a name in the abstract namespace. */
__attribute__((unused)) static void notify(const char *msg) {
  const char *path = getenv("NOTIFY_SOCKET");
  struct sockaddr_un sa;
  size_t n;
  int fd;

  if (path == NULL || path[0] == '\0')
    return;
  n = strlen(path);
  if (n >= sizeof sa.sun_path)
    return;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, n);
  if (sa.sun_path[0] == '@')
    sa.sun_path[0] = '\0';
  fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return;
  if (sendto(fd, msg, strlen(msg), 0, (struct sockaddr *)&sa,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0)
    perror("fake agent: sd_notify");
  close(fd);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "version") == 0) {
    puts("lksadmin-agent " FAKE_VERSION);
    return 0;
  }
#if defined(FAKE_EXIT)
  fprintf(stderr, "fake agent %s: cannot start, exiting 1\n", FAKE_VERSION);
  return 1;
#elif defined(FAKE_HANG)
  fprintf(stderr, "fake agent %s: hanging before READY=1\n", FAKE_VERSION);
  for (;;)
    pause();
#elif defined(FAKE_NO_CONNECT)
  {
    const char *w = getenv("WATCHDOG_USEC");
    unsigned long usec = w != NULL ? strtoul(w, NULL, 10) : 0;
    unsigned int every = usec >= 4000000 ? (unsigned int)(usec / 2000000) : 1;

    fprintf(stderr, "fake agent %s: READY=1, never connecting\n", FAKE_VERSION);
    notify("READY=1\nSTATUS=fake agent: never connecting");
    for (;;) {
      sleep(every);
      notify("WATCHDOG=1");
    }
  }
#else
#error "build with -DFAKE_EXIT, -DFAKE_HANG or -DFAKE_NO_CONNECT"
#endif
}

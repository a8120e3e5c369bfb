/* LD_PRELOAD helper for tools/aoti_cuda_diag.py: on SIGSEGV/SIGBUS/SIGABRT print the native stack
 * (file, symbol, offset from the file's load base, for addr2line) and the faulting address, copy
 * /proc/self/maps to $SEGV_MAPS (if set), then die with the same signal. Runs on its own stack, so a
 * stack overflow is reported too. Build: cc -shared -fPIC -O1 -o segv_backtrace.so segv_backtrace.c */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void report(int sig, siginfo_t *si, void *ctx) {
  (void)ctx;
  void *frames[80];
  int n = backtrace(frames, 80);
  dprintf(2, "NATIVE signal %d at address %p\n", sig, si->si_addr);
  for (int i = 0; i < n; i++) {
    Dl_info d;
    if (dladdr(frames[i], &d) && d.dli_fname) {
      dprintf(2, "NATIVE #%d %s +0x%lx %s\n", i, d.dli_fname, (unsigned long)((char *)frames[i] - (char *)d.dli_fbase),
              d.dli_sname ? d.dli_sname : "?");
    } else {
      dprintf(2, "NATIVE #%d %p\n", i, frames[i]);
    }
  }
  const char *maps = getenv("SEGV_MAPS");
  if (maps) {
    int in = open("/proc/self/maps", O_RDONLY), out = open(maps, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char buf[8192];
    ssize_t k;
    while (in >= 0 && out >= 0 && (k = read(in, buf, sizeof buf)) > 0) (void)!write(out, buf, (size_t)k);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  static char alt[1 << 20];
  stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
  sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = report;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
  sigaction(SIGABRT, &sa, NULL);
}

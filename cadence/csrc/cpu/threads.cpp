// Pinning PyTorch's intra-op (OpenMP) threads to cores; asking Linux for the AMX tiles.

#include "common.h"

#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace cadence_cpu {

// ---- threads ------------------------------------------------------------------------

// Pin OpenMP thread i (PyTorch's intra-op pool: ATen's parallel_for runs on it) to
// cores[i]. Thread 0 is the calling thread. Threads that migrate between cores lose their
// caches and, on a small machine, land on the core another process is using.
void bind_threads(std::vector<int64_t> cores) {
  const int n = static_cast<int>(cores.size());
  TORCH_CHECK(n >= 1, "bind_threads needs at least one core");
  std::vector<int> failed(n, 0);
  omp_set_num_threads(n);
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cores[t]), &set);
    failed[t] = sched_setaffinity(0, sizeof(set), &set) != 0;
  }
  for (int t = 0; t < n; ++t)
    TORCH_CHECK(!failed[t], "could not pin thread ", t, " to core ", cores[t]);
}

// ---- AMX ------------------------------------------------------------------------------

// Whether this process may use the AMX tiles (panel_q8.cpp, panel_bf16.cpp): Linux lends
// their 8 KB of state on request (CADENCE_CPU_AMX=0: never ask; the VNNI and float tiles
// then serve every batch). False on a build without AMX.
bool amx_permitted() {
#if defined(__AMX_TILE__) && defined(__x86_64__)
  static const bool ok = [] {
    const char* env = std::getenv("CADENCE_CPU_AMX");
    if (env != nullptr && std::string(env) == "0") return false;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                   18 /* XFEATURE_XTILEDATA */) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

}  // namespace cadence_cpu

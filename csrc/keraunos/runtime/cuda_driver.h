// The CUDA driver API, loaded at run time (dlopen libcuda.so.1): load CUBINs and launch their
// kernels on the streams torch gives us. Used only on GPU machines; elsewhere
// cuda_driver_available() says why not, and nothing else is called.
//
// We declare the few driver types ourselves (no CUDA headers: keraunos builds without CUDA).
// Contexts are the caller's: torch makes the device's primary context current on the threads
// that use CUDA; ensure_context() makes it current on a thread that has none yet.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include "keraunos/runtime/nvrtc.h" // Availability

namespace keraunos::runtime {

using CUresult = int; // CUDA_SUCCESS is 0
using CUdevice = int;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;

// The driver entry points keraunos uses.
struct CudaDriver {
  int version = 0; // cuDriverGetVersion, e.g. 13000
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  // Optional (CUDA 11.8+; null when the driver lacks it): clusters of a launch resident at once.
  CUresult (*cuOccupancyMaxActiveClusters)(int*, CUfunction, const void* config);
  // Optional as well (null when absent): blocks of a kernel resident on one SM at once.
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
};

// Loads libcuda.so.1 and runs cuInit(0) on first use; false with the reason when there is no
// driver or no device. Never throws.
Availability cuda_driver_available();

// The loaded driver; a user RuntimeError with the reason when unavailable.
const CudaDriver& cuda_driver();

// Throws a RuntimeError naming `what` and the driver's message when `r` is not CUDA_SUCCESS.
void check_cuda(CUresult r, const char* what);

// {major, minor} compute capability of `device` (e.g. {9, 0} on an H100/H200).
std::pair<int, int> compute_capability(int device);

// Makes `device`'s primary context current on this thread when none is (torch uses the primary
// context, so modules loaded here are usable on torch's streams).
void ensure_context(int device);

// A loaded CUBIN; unloaded when destroyed (in the context it was loaded in).
class CudaModule {
public:
  CudaModule(const std::string& cubin, int device);
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  CUfunction function(const std::string& name) const;
  // Lets `f` launch with `bytes` of dynamic shared memory (over 48 KB needs the opt-in).
  static void allow_dynamic_shared_memory(CUfunction f, unsigned bytes);
  // Lets `f` run in clusters of more than 8 blocks (sm_90: up to 16).
  static void allow_non_portable_cluster(CUfunction f);
  // How many clusters of `f` (its compiled-in cluster size) with `block` threads and
  // `shared_mem` bytes fit on the device at once; 0 when the driver cannot say.
  static int max_active_clusters(CUfunction f, const unsigned block[3], unsigned shared_mem);
  // How many blocks of `f` with `threads` threads and `shared_mem` bytes fit on one SM at once;
  // 0 when the driver cannot say.
  static int max_active_blocks_per_sm(CUfunction f, unsigned threads, unsigned shared_mem);
  // `params`: one pointer per kernel parameter, to its value (cuLaunchKernel's kernelParams).
  static void launch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                     unsigned shared_mem, CUstream stream, void** params);
  // The same with the arguments packed into one buffer, laid out like the kernel's parameter
  // list (each at its natural alignment) — how Python passes them (struct.pack).
  static void launch_packed(CUfunction f, const unsigned grid[3], const unsigned block[3],
                            unsigned shared_mem, CUstream stream, const std::string& packed);

private:
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
};

} // namespace keraunos::runtime

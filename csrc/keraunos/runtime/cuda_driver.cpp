#include "keraunos/runtime/cuda_driver.h"

#include "keraunos/ir/error.h"

#include <dlfcn.h>
#include <mutex>

namespace keraunos::runtime {

namespace {

constexpr CUresult kCudaSuccess = 0;
constexpr int kAttrComputeCapabilityMajor = 75; // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrComputeCapabilityMinor = 76;
// cuLaunchKernel's `extra` markers (CU_LAUNCH_PARAM_*).
void* const kLaunchParamEnd = reinterpret_cast<void*>(0x00);
void* const kLaunchParamBufferPointer = reinterpret_cast<void*>(0x01);
void* const kLaunchParamBufferSize = reinterpret_cast<void*>(0x02);

// The loaded driver or why there is none. The one global here, for the same reason as NVRTC's
// loader: dlopen and cuInit are per process. Unlike NVRTC nothing can make a later attempt
// succeed (no search directories: libcuda comes with the kernel driver), so the outcome is
// decided once, under call_once, and read without a lock afterwards.
struct DriverState {
  CudaDriver api{};
  bool ok = false;
  std::string reason;
};

template <typename Fn> void resolve(void* lib, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
}

std::string error_string(const CudaDriver& d, CUresult r) {
  const char* msg = nullptr;
  if (d.cuGetErrorString && d.cuGetErrorString(r, &msg) == kCudaSuccess && msg) return msg;
  return "CUDA error " + std::to_string(r);
}

DriverState open_driver() {
  DriverState s;
  // libcuda.so.1 is the soname the kernel driver installs; libcuda.so (unversioned) is only in
  // development packages. RTLD_LOCAL: torch loads the same library; dlopen shares the handle.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = ::dlerror();
    s.reason = std::string("the CUDA driver (libcuda.so.1) was not found: ") +
               (err ? err : "dlopen failed");
    return s;
  }
  CudaDriver& d = s.api;
  std::string missing;
  resolve(lib, "cuInit", d.cuInit, missing);
  resolve(lib, "cuDriverGetVersion", d.cuDriverGetVersion, missing);
  resolve(lib, "cuDeviceGet", d.cuDeviceGet, missing);
  resolve(lib, "cuDeviceGetCount", d.cuDeviceGetCount, missing);
  resolve(lib, "cuDeviceGetAttribute", d.cuDeviceGetAttribute, missing);
  resolve(lib, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain, missing);
  resolve(lib, "cuCtxGetCurrent", d.cuCtxGetCurrent, missing);
  resolve(lib, "cuCtxSetCurrent", d.cuCtxSetCurrent, missing);
  resolve(lib, "cuModuleLoadData", d.cuModuleLoadData, missing);
  resolve(lib, "cuModuleUnload", d.cuModuleUnload, missing);
  resolve(lib, "cuModuleGetFunction", d.cuModuleGetFunction, missing);
  resolve(lib, "cuLaunchKernel", d.cuLaunchKernel, missing);
  resolve(lib, "cuGetErrorString", d.cuGetErrorString, missing);
  resolve(lib, "cuFuncSetAttribute", d.cuFuncSetAttribute, missing);
  std::string optional; // absent from drivers before CUDA 11.8: clusters are then not capped
  resolve(lib, "cuOccupancyMaxActiveClusters", d.cuOccupancyMaxActiveClusters, optional);
  resolve(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
          d.cuOccupancyMaxActiveBlocksPerMultiprocessor, optional);
  if (!missing.empty()) {
    s.reason = "libcuda.so.1 lacks " + missing + " (driver too old)";
    return s;
  }
  if (CUresult r = d.cuInit(0); r != kCudaSuccess) {
    s.reason = "cuInit failed: " + error_string(d, r);
    return s;
  }
  int count = 0;
  if (CUresult r = d.cuDeviceGetCount(&count); r != kCudaSuccess || count == 0) {
    s.reason = "no CUDA device (" + (r == kCudaSuccess ? "0 devices" : error_string(d, r)) + ")";
    return s;
  }
  d.cuDriverGetVersion(&d.version);
  s.ok = true;
  return s;
}

const DriverState& state() {
  static const DriverState s = open_driver(); // thread-safe once (C++11 magic statics)
  return s;
}

} // namespace

Availability cuda_driver_available() {
  const DriverState& s = state();
  return {s.ok, s.reason};
}

const CudaDriver& cuda_driver() {
  const DriverState& s = state();
  KR_CHECK(s.ok, Runtime, "the CUDA driver is unavailable: ", s.reason);
  return s.api;
}

void check_cuda(CUresult r, const char* what) {
  if (r == kCudaSuccess) return;
  KR_USER_ERROR(Runtime, what, " failed: ", error_string(cuda_driver(), r));
}

std::pair<int, int> compute_capability(int device) {
  const CudaDriver& d = cuda_driver();
  CUdevice dev = 0;
  check_cuda(d.cuDeviceGet(&dev, device), "cuDeviceGet");
  int major = 0, minor = 0;
  check_cuda(d.cuDeviceGetAttribute(&major, kAttrComputeCapabilityMajor, dev),
             "cuDeviceGetAttribute");
  check_cuda(d.cuDeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, dev),
             "cuDeviceGetAttribute");
  return {major, minor};
}

void ensure_context(int device) {
  const CudaDriver& d = cuda_driver();
  CUcontext ctx = nullptr;
  check_cuda(d.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (ctx) return;
  CUdevice dev = 0;
  check_cuda(d.cuDeviceGet(&dev, device), "cuDeviceGet");
  // Retained for the process's lifetime, like torch's own retain of the primary context.
  check_cuda(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check_cuda(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

CudaModule::CudaModule(const std::string& cubin, int device) {
  ensure_context(device);
  const CudaDriver& d = cuda_driver();
  check_cuda(d.cuCtxGetCurrent(&context_), "cuCtxGetCurrent");
  check_cuda(d.cuModuleLoadData(&module_, cubin.data()), "cuModuleLoadData");
}

CudaModule::~CudaModule() {
  if (!module_) return;
  // cuModuleUnload acts on the current context, which may be another device's by now. Errors
  // are ignored: at interpreter exit the driver may already be shut down.
  const CudaDriver& d = cuda_driver();
  CUcontext current = nullptr;
  if (d.cuCtxGetCurrent(&current) != kCudaSuccess) return;
  if (current != context_) d.cuCtxSetCurrent(context_);
  d.cuModuleUnload(module_);
  if (current != context_) d.cuCtxSetCurrent(current);
}

CUfunction CudaModule::function(const std::string& name) const {
  CUfunction f = nullptr;
  const CUresult r = cuda_driver().cuModuleGetFunction(&f, module_, name.c_str());
  if (r != kCudaSuccess)
    KR_USER_ERROR(Runtime, "cuModuleGetFunction(", name, ") failed: ",
                  error_string(cuda_driver(), r), " (is the kernel extern \"C\"?)");
  return f;
}

void CudaModule::allow_dynamic_shared_memory(CUfunction f, unsigned bytes) {
  constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8; // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_...
  if (bytes <= 48 * 1024) return;
  check_cuda(cuda_driver().cuFuncSetAttribute(f, kFuncAttrMaxDynamicSharedSizeBytes,
                                              static_cast<int>(bytes)),
             "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

void CudaModule::allow_non_portable_cluster(CUfunction f) {
  constexpr int kFuncAttrNonPortableClusterSizeAllowed = 14; // CU_FUNC_ATTRIBUTE_NON_PORTABLE_...
  check_cuda(cuda_driver().cuFuncSetAttribute(f, kFuncAttrNonPortableClusterSizeAllowed, 1),
             "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
}

int CudaModule::max_active_clusters(CUfunction f, const unsigned block[3], unsigned shared_mem) {
  // CUlaunchConfig (cuda.h), declared here as the driver lays it out on 64-bit hosts.
  struct LaunchConfig {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_mem;
    CUstream stream;
    void* attrs;
    unsigned num_attrs;
  };
  const CudaDriver& d = cuda_driver();
  if (!d.cuOccupancyMaxActiveClusters) return 0;
  // The cluster size is the kernel's own (__cluster_dims__), so no launch attribute is given;
  // the grid only has to be a multiple of it.
  LaunchConfig c{16, 1, 1, block[0], block[1], block[2], shared_mem, nullptr, nullptr, 0};
  int n = 0;
  if (d.cuOccupancyMaxActiveClusters(&n, f, &c) != kCudaSuccess) return 0;
  return n;
}

int CudaModule::max_active_blocks_per_sm(CUfunction f, unsigned threads, unsigned shared_mem) {
  const CudaDriver& d = cuda_driver();
  if (!d.cuOccupancyMaxActiveBlocksPerMultiprocessor) return 0;
  int n = 0;
  if (d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, static_cast<int>(threads), shared_mem) !=
      kCudaSuccess)
    return 0;
  return n;
}

void CudaModule::launch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                        unsigned shared_mem, CUstream stream, void** params) {
  check_cuda(cuda_driver().cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1],
                                          block[2], shared_mem, stream, params, nullptr),
             "cuLaunchKernel");
}

void CudaModule::launch_packed(CUfunction f, const unsigned grid[3], const unsigned block[3],
                               unsigned shared_mem, CUstream stream, const std::string& packed) {
  std::size_t size = packed.size();
  void* extra[] = {kLaunchParamBufferPointer, const_cast<char*>(packed.data()),
                   kLaunchParamBufferSize, &size, kLaunchParamEnd};
  check_cuda(cuda_driver().cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1],
                                          block[2], shared_mem, stream, nullptr, extra),
             "cuLaunchKernel");
}

} // namespace keraunos::runtime

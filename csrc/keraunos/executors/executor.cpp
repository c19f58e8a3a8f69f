#include "keraunos/executors/executor.h"

#include "keraunos/ir/error.h"

namespace keraunos::executors {

Executor& cpu_executor();
Executor& cuda_executor();

Executor& executor_for(DeviceType device) {
  switch (device) {
  case DeviceType::CPU:
    return cpu_executor();
  case DeviceType::CUDA:
    return cuda_executor();
  }
  KR_INTERNAL(false, "no executor for this device");
  return cpu_executor();
}

} // namespace keraunos::executors

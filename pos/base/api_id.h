// api_id.h — the stable numeric id of every API POS executes, and how each one returns.
// Ids are part of the wire and image formats: never renumber, only append (docs/api_set.md).
#pragma once

#include <cstdint>
#include <string_view>

namespace pos {

// How pos_process returns for an API:
//  kParse: the parser can produce the result (or the call has none): return right after parsing;
//          the worker executes it asynchronously, errors surface later (cudaGetLastError / next sync).
//  kSync:  the result needs the worker (device results, synchronization, queries): wait for it.
enum class ReturnMode : uint8_t { kParse, kSync };

// How a client library sends the call to posd (docs/wire_format.md):
//  kPosted:  the frame goes onto the ring and the call returns; its error comes with the next reply,
//            as CUDA reports asynchronous errors (launches, async memsets, event records, GEMMs).
//  kReplied: the caller waits for posd's reply (every call with a result, and every kSync call).
enum class Delivery : uint8_t { kReplied, kPosted };

// The one descriptor of an API's identity: X(enum name, CUDA/cuBLAS name, id, return mode, delivery).
// Its parser and worker functions are registered by pos/cuda_impl (a missing one stops POS at
// start-up); its entry point lives in the client shim (docs/adding_an_api.md).
#define POS_API_LIST(X)                                                                                         \
  X(GetDeviceCount, "cudaGetDeviceCount", 0x101, kSync, kReplied)                                               \
  X(GetDevice, "cudaGetDevice", 0x102, kParse, kReplied)                                                        \
  X(SetDevice, "cudaSetDevice", 0x103, kParse, kReplied)                                                        \
  X(GetDeviceProperties, "cudaGetDeviceProperties", 0x104, kSync, kReplied)                                     \
  X(DeviceGetAttribute, "cudaDeviceGetAttribute", 0x105, kSync, kReplied)                                       \
  X(DeviceSynchronize, "cudaDeviceSynchronize", 0x106, kSync, kReplied)                                         \
  X(MemGetInfo, "cudaMemGetInfo", 0x107, kSync, kReplied)                                                       \
  X(DriverGetVersion, "cudaDriverGetVersion", 0x108, kSync, kReplied)                                           \
  X(RuntimeGetVersion, "cudaRuntimeGetVersion", 0x109, kParse, kReplied)                                        \
  X(GetLastError, "cudaGetLastError", 0x10A, kParse, kPosted)                                                   \
  X(PeekAtLastError, "cudaPeekAtLastError", 0x10B, kParse, kReplied)                                            \
  X(Malloc, "cudaMalloc", 0x201, kParse, kReplied)                                                              \
  X(Free, "cudaFree", 0x202, kParse, kReplied)                                                                  \
  X(Memcpy, "cudaMemcpy", 0x203, kSync, kReplied)                                                               \
  X(MemcpyAsync, "cudaMemcpyAsync", 0x204, kParse, kReplied)                                                    \
  X(Memset, "cudaMemset", 0x205, kParse, kPosted)                                                               \
  X(MemsetAsync, "cudaMemsetAsync", 0x206, kParse, kPosted)                                                     \
  X(PointerGetAttributes, "cudaPointerGetAttributes", 0x207, kParse, kReplied)                                  \
  X(MemcpyToSymbol, "cudaMemcpyToSymbol", 0x208, kSync, kReplied)                                               \
  X(MemcpyFromSymbol, "cudaMemcpyFromSymbol", 0x209, kSync, kReplied)                                           \
  X(StreamCreate, "cudaStreamCreate", 0x301, kParse, kReplied)                                                  \
  X(StreamCreateWithFlags, "cudaStreamCreateWithFlags", 0x302, kParse, kReplied)                                \
  X(StreamCreateWithPriority, "cudaStreamCreateWithPriority", 0x303, kParse, kReplied)                          \
  X(StreamDestroy, "cudaStreamDestroy", 0x304, kParse, kReplied)                                                \
  X(StreamSynchronize, "cudaStreamSynchronize", 0x305, kSync, kReplied)                                         \
  X(StreamQuery, "cudaStreamQuery", 0x306, kSync, kReplied)                                                     \
  X(StreamWaitEvent, "cudaStreamWaitEvent", 0x307, kParse, kPosted)                                             \
  X(EventCreate, "cudaEventCreate", 0x341, kParse, kReplied)                                                    \
  X(EventCreateWithFlags, "cudaEventCreateWithFlags", 0x342, kParse, kReplied)                                  \
  X(EventDestroy, "cudaEventDestroy", 0x343, kParse, kReplied)                                                  \
  X(EventRecord, "cudaEventRecord", 0x344, kParse, kPosted)                                                     \
  X(EventSynchronize, "cudaEventSynchronize", 0x345, kSync, kReplied)                                           \
  X(EventQuery, "cudaEventQuery", 0x346, kSync, kReplied)                                                       \
  X(EventElapsedTime, "cudaEventElapsedTime", 0x347, kSync, kReplied)                                           \
  X(RegisterFatBinary, "__cudaRegisterFatBinary", 0x401, kParse, kReplied)                                      \
  X(RegisterFunction, "__cudaRegisterFunction", 0x402, kSync, kReplied)                                         \
  X(RegisterVar, "__cudaRegisterVar", 0x403, kSync, kReplied)                                                   \
  X(UnregisterFatBinary, "__cudaUnregisterFatBinary", 0x404, kParse, kReplied)                                  \
  X(LaunchKernel, "cudaLaunchKernel", 0x405, kParse, kPosted)                                                   \
  X(FuncGetAttributes, "cudaFuncGetAttributes", 0x406, kSync, kReplied)                                         \
  X(FuncSetAttribute, "cudaFuncSetAttribute", 0x407, kSync, kReplied)                                           \
  X(OccupancyMaxActiveBlocks, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", 0x408, kSync, kReplied)          \
  X(OccupancyMaxActiveBlocksWithFlags, "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 0x409, kSync, kReplied) \
  X(CublasCreate, "cublasCreate", 0x501, kParse, kReplied)                                                      \
  X(CublasDestroy, "cublasDestroy", 0x502, kParse, kReplied)                                                    \
  X(CublasSetStream, "cublasSetStream", 0x503, kParse, kPosted)                                                 \
  X(CublasGetStream, "cublasGetStream", 0x504, kParse, kReplied)                                                \
  X(CublasSetMathMode, "cublasSetMathMode", 0x505, kParse, kPosted)                                             \
  X(CublasSgemm, "cublasSgemm", 0x506, kParse, kPosted)                                                         \
  X(CublasGemmEx, "cublasGemmEx", 0x507, kParse, kPosted)                                                       \
  X(CublasSgemmStridedBatched, "cublasSgemmStridedBatched", 0x508, kParse, kPosted)

enum class ApiId : uint32_t {
#define POS_API_ENUM(e, n, id, m, d) k##e = id,
  POS_API_LIST(POS_API_ENUM)
#undef POS_API_ENUM
};

// Ids are below this bound (an index of this size answers every lookup by id).
inline constexpr uint32_t kApiIdLimit = 0x600;

struct ApiInfo {
  ApiId id;
  std::string_view name;
  ReturnMode mode;
  Delivery delivery;
  bool is_cublas;  // errors are cublasStatus_t, not cudaError_t
  bool posted() const { return delivery == Delivery::kPosted; }
};

// nullptr for an id POS does not know (a client's bad input, never an abort).
const ApiInfo* find_api(uint32_t id);
const ApiInfo& api_info(ApiId id);
std::string_view api_name(ApiId id);
// Every API, in id order (for docs, tests, dispatch tables).
const ApiInfo* all_apis(size_t* count);

}  // namespace pos

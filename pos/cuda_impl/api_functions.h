// api_functions.h — the CUDA API set's parser and worker functions, by family, the resource types'
// hooks, and the table fill. Parser functions validate, allocate mocked handles and record DAG
// edges; worker functions call the backend; resource hooks record, restore and move handles.
#pragma once

#include <cstdint>
#include <string>

#include "pos/api_table.h"
#include "pos/base/hex.h"
#include "pos/base/text.h"
#include "pos/client.h"

namespace pos::cuda_impl {

// Every API's functions and every resource type's hooks (checked by the runtime: ApiTable::gaps).
void fill_api_table(ApiTable* table);

// Per-family registration (one .cc per family): one `t->set(ApiId::k..., {parse, work})` per API.
void register_device_apis(ApiTable* t);
void register_memory_apis(ApiTable* t);
void register_stream_apis(ApiTable* t);
void register_module_apis(ApiTable* t);
void register_cublas_apis(ApiTable* t);
// One ResourceOps per resource type (resource_hooks.cc).
void register_resource_hooks(ResourceTable* t);

// Shared parsing helpers.
using ::pos::hex;
inline Status cuda_error(int32_t e, std::string msg) { return Status::Cuda(e, std::move(msg)); }
inline Status cublas_error(int32_t e, std::string msg) { return Status::Cublas(e, std::move(msg)); }
// A kernel's or symbol's name as an error message quotes it: the name is the client's bytes (any
// but NUL, up to 4 KiB), and the message reaches the app's stderr and posd's log, so it goes in as
// printable() text, at most 256 bytes of it (docs/remoting.md, "Job names", has the same rule).
inline std::string quoted_name(const std::string& name) { return "'" + printable(name, 256) + "'"; }

// Reads parameter i as T; a missing or wrongly sized parameter is cudaErrorInvalidValue.
#define POS_PARAM(ctx, i, T, var) \
  T var{};                        \
  POS_RETURN_IF_ERROR((ctx).get((i), &var))

// The same for cuBLAS APIs, where a bad parameter is CUBLAS_STATUS_INVALID_VALUE.
#define POS_BLAS_PARAM(ctx, i, T, var)                                          \
  T var{};                                                                      \
  do {                                                                          \
    ::pos::Status pos_s_ = (ctx).get((i), &var);                                \
    if (!pos_s_.ok()) return ::pos::Status::Cublas(::pos::cuda::kCublasInvalidValue, pos_s_.message()); \
  } while (0)

}  // namespace pos::cuda_impl

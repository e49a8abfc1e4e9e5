// cublas_api.cc — the cuBLAS subset: handles bound to streams, math mode, and GEMMs whose
// operands are checked against the client's buffers (A, B read; C written) before they run.
#include "pos/base/api_types.h"
#include "pos/cuda_impl/api_functions.h"

namespace pos::cuda_impl {
namespace {

Status blas_invalid(std::string m) { return cublas_error(cuda::kCublasInvalidValue, std::move(m)); }

Status handle_of(ParserScope& ps, APIContext& c, size_t i, Handle** out) {
  POS_BLAS_PARAM(c, i, uint64_t, hv);
  Handle* h = ps.mgr(ResourceType::kCublas).get(hv);
  if (h == nullptr) return cublas_error(cuda::kCublasNotInitialized, "unknown cuBLAS handle " + hex(hv));
  *out = h;
  return Status::Ok();
}

Status parse_create(ParserScope& ps, APIContext& c) {
  if (c.param_count() != 0) return blas_invalid("cublasCreate takes no parameters");
  auto h = ps.mgr(ResourceType::kCublas).allocate_mocked_resource(0, {ps.context}, c.pc);
  if (!h.ok()) return cublas_error(cuda::kCublasAllocFailed, h.status().message());
  (*h)->bound_stream = 0;
  (*h)->bound_stream_handle = ps.default_stream;
  (*h)->math_mode = kCublasDefaultMath;
  c.h[0] = *h;
  c.add_edge(*h, EdgeKind::kCreate);
  c.set_ret<uint64_t>((*h)->client_addr);
  return Status::Ok();
}
Status work_create(WorkerScope& ws, APIContext& c) {
  auto b = ws.backend->blas_create();
  if (!b.ok()) return b.status();
  c.h[0]->backend_obj = *b;
  return Status::Ok();
}

Status parse_destroy(ParserScope& ps, APIContext& c) {
  if (c.param_count() != 1) return blas_invalid("cublasDestroy takes one parameter");
  Handle* h = nullptr;
  POS_RETURN_IF_ERROR(handle_of(ps, c, 0, &h));
  ps.mgr(ResourceType::kCublas).mark_deleted(h);
  c.h[0] = h;
  c.add_edge(h, EdgeKind::kDelete);
  return Status::Ok();
}
Status work_destroy(WorkerScope& ws, APIContext& c) { return ws.backend->blas_destroy(c.h[0]->backend_obj); }

Status parse_set_stream(ParserScope& ps, APIContext& c) {
  if (c.param_count() != 2) return blas_invalid("cublasSetStream takes two parameters");
  Handle* h = nullptr;
  POS_RETURN_IF_ERROR(handle_of(ps, c, 0, &h));
  POS_BLAS_PARAM(c, 1, uint64_t, sv);
  Handle* s = ps.stream(sv);
  if (s == nullptr) return blas_invalid("unknown stream " + hex(sv));
  h->bound_stream = sv;
  h->bound_stream_handle = s;
  c.h[0] = h, c.h[1] = s;
  c.add_edge(h, EdgeKind::kInOut);
  c.add_edge(s, EdgeKind::kIn);
  return Status::Ok();
}
Status work_set_stream(WorkerScope& ws, APIContext& c) {
  return ws.backend->blas_set_stream(c.h[0]->backend_obj, c.h[1]->backend_obj);
}

// cublasGetStream: the parser knows the binding.
Status parse_get_stream(ParserScope& ps, APIContext& c) {
  if (c.param_count() != 1) return blas_invalid("cublasGetStream takes one parameter");
  Handle* h = nullptr;
  POS_RETURN_IF_ERROR(handle_of(ps, c, 0, &h));
  c.set_ret<uint64_t>(h->bound_stream);
  return Status::Ok();
}
Status work_nothing(WorkerScope&, APIContext&) { return Status::Ok(); }

Status parse_set_math_mode(ParserScope& ps, APIContext& c) {
  if (c.param_count() != 2) return blas_invalid("cublasSetMathMode takes two parameters");
  Handle* h = nullptr;
  POS_RETURN_IF_ERROR(handle_of(ps, c, 0, &h));
  POS_BLAS_PARAM(c, 1, int32_t, mode);
  // Base modes 0..3, optionally | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (16).
  if ((mode & 0xF) > 3 || (mode & ~0x1F) != 0 || (mode & 0x10 & ~0x10) != 0)
    return blas_invalid("invalid cuBLAS math mode " + std::to_string(mode));
  h->math_mode = mode;
  c.h[0] = h;
  c.u[0] = static_cast<uint32_t>(mode);
  c.add_edge(h, EdgeKind::kInOut);
  return Status::Ok();
}
Status work_set_math_mode(WorkerScope& ws, APIContext& c) {
  return ws.backend->blas_set_math_mode(c.h[0]->backend_obj, static_cast<int32_t>(c.u[0]));
}

int64_t element_size(int32_t data_type) {
  switch (data_type) {
    case 0: return 4;   // CUDA_R_32F
    case 1: return 8;   // CUDA_R_64F
    case 2: return 2;   // CUDA_R_16F
    case 3: return 1;   // CUDA_R_8I
    case 10: return 4;  // CUDA_R_32I
    case 14: return 2;  // CUDA_R_16BF
    default: return 0;
  }
}

// Bytes a column-major rows x cols operand with leading dimension ld spans, over `batch` matrices.
Status check_operand(ParserScope& ps, APIContext& c, const char* what, uint64_t ptr, int64_t rows, int64_t cols,
                     int64_t ld, int64_t stride, int32_t batch, int64_t esize, EdgeKind kind) {
  if (ld < std::max<int64_t>(1, rows)) return blas_invalid(std::string("leading dimension of ") + what + " too small");
  if (rows == 0 || cols == 0) return Status::Ok();
  if (stride < 0) return blas_invalid(std::string("negative stride for ") + what);
  const unsigned __int128 one = static_cast<unsigned __int128>((cols - 1)) * ld + rows;
  const unsigned __int128 total = (static_cast<unsigned __int128>(stride) * (batch - 1) + one) * esize;
  if (total > (static_cast<unsigned __int128>(1) << 50)) return blas_invalid(std::string(what) + " is too large");
  uint64_t off = 0;
  Handle* h = ps.device_range(ptr, static_cast<uint64_t>(total), &off);
  if (h == nullptr)
    return blas_invalid(std::string("matrix ") + what + " (" + hex(ptr) + ", " + std::to_string(static_cast<uint64_t>(total)) +
                        " bytes) is not inside a live device allocation of this client");
  c.add_edge(h, kind, off, static_cast<uint64_t>(total));
  return Status::Ok();
}

Status parse_gemm_args(ParserScope& ps, APIContext& c, GemmArgs& g) {
  if (c.param_count() != 2) return blas_invalid("GEMM takes a handle and an argument record");
  Handle* h = nullptr;
  POS_RETURN_IF_ERROR(handle_of(ps, c, 0, &h));
  POS_BLAS_PARAM(c, 1, GemmArgs, args);
  g = args;
  auto op_ok = [](int32_t op) { return op >= 0 && op <= 2; };
  if (!op_ok(g.transa) || !op_ok(g.transb)) return blas_invalid("invalid cublasOperation_t");
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0) return blas_invalid("negative matrix dimension or batch count");
  const int64_t ea = element_size(g.a_type), eb = element_size(g.b_type), ec = element_size(g.c_type);
  if (ea == 0 || eb == 0 || ec == 0) return blas_invalid("unsupported cudaDataType");
  if (g.m == 0 || g.n == 0 || g.batch == 0) {
    c.h[0] = h;
    c.skip_worker = true;  // nothing to compute: cuBLAS returns success
    return Status::Ok();
  }
  const int64_t ar = g.transa == 0 ? g.m : g.k, ac = g.transa == 0 ? g.k : g.m;
  const int64_t br = g.transb == 0 ? g.k : g.n, bc = g.transb == 0 ? g.n : g.k;
  if (g.k > 0) {
    POS_RETURN_IF_ERROR(check_operand(ps, c, "A", g.a, ar, ac, g.lda, g.stride_a, g.batch, ea, EdgeKind::kIn));
    POS_RETURN_IF_ERROR(check_operand(ps, c, "B", g.b, br, bc, g.ldb, g.stride_b, g.batch, eb, EdgeKind::kIn));
  }
  POS_RETURN_IF_ERROR(check_operand(ps, c, "C", g.c, g.m, g.n, g.ldc, g.stride_c, g.batch, ec,
                                    g.beta == 0.0f ? EdgeKind::kOut : EdgeKind::kInOut));
  c.h[0] = h;
  c.add_edge(h, EdgeKind::kIn);
  return Status::Ok();
}

Status parse_sgemm(ParserScope& ps, APIContext& c) {
  GemmArgs g{};
  POS_RETURN_IF_ERROR(parse_gemm_args(ps, c, g));
  if (g.a_type != kCudaR32F || g.b_type != kCudaR32F || g.c_type != kCudaR32F || g.batch != 1)
    return blas_invalid("cublasSgemm operands are float and unbatched");
  return Status::Ok();
}
Status parse_gemm_ex(ParserScope& ps, APIContext& c) {
  GemmArgs g{};
  POS_RETURN_IF_ERROR(parse_gemm_args(ps, c, g));
  if (g.batch != 1) return blas_invalid("cublasGemmEx is unbatched");
  return Status::Ok();
}
Status parse_sgemm_strided(ParserScope& ps, APIContext& c) {
  GemmArgs g{};
  POS_RETURN_IF_ERROR(parse_gemm_args(ps, c, g));
  if (g.a_type != kCudaR32F || g.b_type != kCudaR32F || g.c_type != kCudaR32F)
    return blas_invalid("cublasSgemmStridedBatched operands are float");
  return Status::Ok();
}
Status work_gemm(WorkerScope& ws, APIContext& c) {
  GemmArgs g{};
  std::memcpy(&g, c.param_bytes(1).data(), sizeof(g));
  // The device backend calls the same cuBLAS entry point, so it picks the kernels the app would get.
  g.entry = c.api_id == ApiId::kCublasSgemm    ? kGemmEntrySgemm
            : c.api_id == ApiId::kCublasGemmEx ? kGemmEntryGemmEx
                                               : kGemmEntryStridedBatched;
  return ws.backend->blas_gemm(c.h[0]->backend_obj, g);
}

}  // namespace

void register_cublas_apis(ApiTable* t) {
  t->set(ApiId::kCublasCreate, {parse_create, work_create});
  t->set(ApiId::kCublasDestroy, {parse_destroy, work_destroy});
  t->set(ApiId::kCublasSetStream, {parse_set_stream, work_set_stream});
  t->set(ApiId::kCublasGetStream, {parse_get_stream, work_nothing});
  t->set(ApiId::kCublasSetMathMode, {parse_set_math_mode, work_set_math_mode});
  t->set(ApiId::kCublasSgemm, {parse_sgemm, work_gemm});
  t->set(ApiId::kCublasGemmEx, {parse_gemm_ex, work_gemm});
  t->set(ApiId::kCublasSgemmStridedBatched, {parse_sgemm_strided, work_gemm});
}

}  // namespace pos::cuda_impl

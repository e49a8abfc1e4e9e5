// cpu_blas.cc — the host backend's SGEMM: a packed, register-blocked kernel on one CPU thread.
// Serves cublasSgemm* calls run by the host backend and by direct reference runs; both must agree bit for bit.
#include "pos/backends/host/cpu_blas.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>

// The contract is "each product rounded to float, then added". GCC contracts a*b+c into an FMA by
// default in C++ (even -std=c++20) once the target has FMA (-march=native, x86-64-v3); that would
// change results between builds. Pin it off for everything defined below.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace pos::host {
namespace {

// Every C element is accumulated in one float, products added strictly in increasing k. Blocking
// over k is allowed because the running sum is parked in a float workspace between k blocks, which
// stores exactly the value a single uninterrupted loop would hold; padding only ever adds whole
// extra rows/columns, never extra terms to a real element's sum.
constexpr int kMR = 8;    // micro-tile rows: one 8-float vector
constexpr int kNR = 4;    // micro-tile columns: 4 vector accumulators fit any x86-64 register file
constexpr int kMC = 128;  // rows of A packed at once (MC x KC floats = 128 KiB: L2)
constexpr int kKC = 256;  // depth of one k block
constexpr int kNC = 256;  // columns of B packed at once (KC x NC floats = 256 KiB)

// GCC/Clang vector extension: lane-wise IEEE float ops, identical to the scalar expression per lane.
// Never passed by value (that would tie the ABI to AVX); only moved with memcpy.
typedef float V8 __attribute__((vector_size(32)));

// Per-thread scratch: host streams run GEMMs on several threads at once.
struct Workspace {
  float* a = nullptr;    // kMC x kKC, packed in kMR-row panels
  float* b = nullptr;    // kKC x kNC, packed in kNR-column panels
  float* acc = nullptr;  // kMC x kNC running sums, column-major, ld = kMC
  Workspace() {
    a = new (std::align_val_t(64)) float[size_t{kMC} * kKC];
    b = new (std::align_val_t(64)) float[size_t{kKC} * kNC];
    acc = new (std::align_val_t(64)) float[size_t{kMC} * kNC];
  }
  ~Workspace() {
    operator delete[](a, std::align_val_t(64));
    operator delete[](b, std::align_val_t(64));
    operator delete[](acc, std::align_val_t(64));
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
};

Workspace& workspace() {
  static thread_local Workspace ws;
  return ws;
}

// op(X)(r, c) for a column-major X; kC is kT for real data.
inline float op_at(BlasOp op, const float* x, long long ld, long long r, long long c) {
  return op == BlasOp::kN ? x[r + c * ld] : x[c + r * ld];
}

// Packs op(A)[i0:i0+mc, p0:p0+kc] into kMR-row panels: panel q holds, for each k, kMR consecutive rows.
void pack_a(BlasOp ta, const float* A, long long lda, long long i0, int mc, long long p0, int kc, float* dst) {
  for (int q = 0; q < mc; q += kMR) {
    const int rows = std::min(kMR, mc - q);
    float* panel = dst + static_cast<size_t>(q) * kc;
    if (ta == BlasOp::kN) {
      for (int p = 0; p < kc; ++p) {
        const float* src = A + (i0 + q) + (p0 + p) * lda;
        float* d = panel + static_cast<size_t>(p) * kMR;
        int r = 0;
        for (; r < rows; ++r) d[r] = src[r];
        for (; r < kMR; ++r) d[r] = 0.0f;
      }
    } else {
      // op(A)(i, p) = A[p + i*lda]: walk each source column (contiguous in p) once.
      for (int r = 0; r < kMR; ++r) {
        if (r < rows) {
          const float* src = A + (p0) + (i0 + q + r) * lda;
          for (int p = 0; p < kc; ++p) panel[static_cast<size_t>(p) * kMR + r] = src[p];
        } else {
          for (int p = 0; p < kc; ++p) panel[static_cast<size_t>(p) * kMR + r] = 0.0f;
        }
      }
    }
  }
}

// Packs op(B)[p0:p0+kc, j0:j0+nc] into kNR-column panels: panel q holds, for each k, kNR columns.
void pack_b(BlasOp tb, const float* B, long long ldb, long long p0, int kc, long long j0, int nc, float* dst) {
  for (int q = 0; q < nc; q += kNR) {
    const int cols = std::min(kNR, nc - q);
    float* panel = dst + static_cast<size_t>(q) * kc;
    for (int c = 0; c < kNR; ++c) {
      if (c < cols) {
        const long long j = j0 + q + c;
        if (tb == BlasOp::kN) {
          const float* src = B + p0 + j * ldb;
          for (int p = 0; p < kc; ++p) panel[static_cast<size_t>(p) * kNR + c] = src[p];
        } else {
          for (int p = 0; p < kc; ++p) panel[static_cast<size_t>(p) * kNR + c] = op_at(tb, B, ldb, p0 + p, j);
        }
      } else {
        for (int p = 0; p < kc; ++p) panel[static_cast<size_t>(p) * kNR + c] = 0.0f;
      }
    }
  }
}

// acc[kMR x kNR] (ld = kMC) += packed A panel x packed B panel over kc steps, k ascending.
// `first` starts the sums at zero instead of reading the parked partial sums.
inline void micro_kernel(int kc, const float* ap, const float* bp, float* acc, bool first) {
  V8 c0{}, c1{}, c2{}, c3{};
  if (!first) {
    std::memcpy(&c0, acc + 0 * kMC, sizeof c0);
    std::memcpy(&c1, acc + 1 * kMC, sizeof c1);
    std::memcpy(&c2, acc + 2 * kMC, sizeof c2);
    std::memcpy(&c3, acc + 3 * kMC, sizeof c3);
  }
  for (int p = 0; p < kc; ++p) {
    V8 a;
    std::memcpy(&a, ap + static_cast<size_t>(p) * kMR, sizeof a);
    const float* b = bp + static_cast<size_t>(p) * kNR;
    // Products are rounded to float before the add: a separate multiply, then add.
    const V8 p0 = a * b[0];
    const V8 p1 = a * b[1];
    const V8 p2 = a * b[2];
    const V8 p3 = a * b[3];
    c0 = c0 + p0;
    c1 = c1 + p1;
    c2 = c2 + p2;
    c3 = c3 + p3;
  }
  std::memcpy(acc + 0 * kMC, &c0, sizeof c0);
  std::memcpy(acc + 1 * kMC, &c1, sizeof c1);
  std::memcpy(acc + 2 * kMC, &c2, sizeof c2);
  std::memcpy(acc + 3 * kMC, &c3, sizeof c3);
}

// C = beta*C without touching A/B; beta == 0 writes zeros (old contents may be NaN).
void scale_c(int m, int n, float beta, float* C, long long ldc) {
  for (long long j = 0; j < n; ++j) {
    float* c = C + j * ldc;
    if (beta == 0.0f) {
      for (int i = 0; i < m; ++i) c[i] = 0.0f;
    } else {
      for (int i = 0; i < m; ++i) c[i] = beta * c[i];
    }
  }
}

}  // namespace

void sgemm(BlasOp ta, BlasOp tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
           int ldb, float beta, float* C, int ldc) {
  if (m <= 0 || n <= 0 || k < 0) return;
  // BLAS quick returns: with no products (k == 0) or alpha == 0, A and B are never read.
  if (k == 0 || alpha == 0.0f) {
    if (beta != 1.0f) scale_c(m, n, beta, C, ldc);
    return;
  }
  if (ta == BlasOp::kC) ta = BlasOp::kT;
  if (tb == BlasOp::kC) tb = BlasOp::kT;

  Workspace& ws = workspace();
  for (long long j0 = 0; j0 < n; j0 += kNC) {
    const int nc = static_cast<int>(std::min<long long>(kNC, n - j0));
    for (long long i0 = 0; i0 < m; i0 += kMC) {
      const int mc = static_cast<int>(std::min<long long>(kMC, m - i0));
      for (long long p0 = 0; p0 < k; p0 += kKC) {
        const int kc = static_cast<int>(std::min<long long>(kKC, k - p0));
        const bool first = p0 == 0;
        pack_a(ta, A, lda, i0, mc, p0, kc, ws.a);
        pack_b(tb, B, ldb, p0, kc, j0, nc, ws.b);
        for (int jq = 0; jq < nc; jq += kNR) {
          const float* bp = ws.b + static_cast<size_t>(jq) * kc;
          for (int iq = 0; iq < mc; iq += kMR) {
            micro_kernel(kc, ws.a + static_cast<size_t>(iq) * kc, bp, ws.acc + iq + static_cast<size_t>(jq) * kMC,
                         first);
          }
        }
      }
      // Finish the block: C = alpha*acc + beta*C, never reading C when beta == 0.
      for (int jj = 0; jj < nc; ++jj) {
        float* c = C + i0 + (j0 + jj) * static_cast<long long>(ldc);
        const float* acc = ws.acc + static_cast<size_t>(jj) * kMC;
        if (beta == 0.0f) {
          for (int ii = 0; ii < mc; ++ii) c[ii] = alpha * acc[ii];
        } else {
          for (int ii = 0; ii < mc; ++ii) {
            const float scaled = alpha * acc[ii];
            const float old = beta * c[ii];
            c[ii] = scaled + old;
          }
        }
      }
    }
  }
}

void sgemm_strided_batched(BlasOp ta, BlasOp tb, int m, int n, int k, float alpha, const float* A, int lda,
                           long long stride_a, const float* B, int ldb, long long stride_b, float beta, float* C,
                           int ldc, long long stride_c, int batch) {
  for (long long i = 0; i < batch; ++i) {
    sgemm(ta, tb, m, n, k, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta, C + i * stride_c, ldc);
  }
}

}  // namespace pos::host

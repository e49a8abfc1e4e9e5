// cpu_blas.h — the host backend's cuBLAS: column-major SGEMM variants with a fixed summation order.
// Deterministic by construction so that pipeline runs and direct reference runs are bit-identical.
#pragma once

#include <cstdint>

namespace pos::host {

// Values match cublasOperation_t.
enum class BlasOp : int32_t { kN = 0, kT = 1, kC = 2 };

// C = alpha * op(A) * op(B) + beta * C, column-major, like cublasSgemm. For each C element the
// products are summed in order of k, in float; beta == 0 ignores C's old contents (BLAS rule).
void sgemm(BlasOp ta, BlasOp tb, int m, int n, int k, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

void sgemm_strided_batched(BlasOp ta, BlasOp tb, int m, int n, int k, float alpha, const float* A,
                           int lda, long long stride_a, const float* B, int ldb, long long stride_b,
                           float beta, float* C, int ldc, long long stride_c, int batch);

}  // namespace pos::host

// host_kernels_test.cc — tests the host backend's kernel library, its SGEMM, and the MLP workload's CPU reference.
// These are what make "mlp_train under POS's host backend == mlp_reference, byte for byte" a meaningful check.
#include <cxxabi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pos/backends/host/cpu_blas.h"
#include "pos/backends/host/host_kernels.h"
#include "workloads/mlp_common.h"
#include "workloads/mlp_host_kernels.h"
#include "workloads/mlp_reference.h"

namespace {

using pos::host::BlasOp;
using pos::host::HostKernel;
using pos::host::KernelRegistry;

std::string demangle(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status),
                                             std::free);
  return status == 0 && out ? std::string(out.get()) : std::string();
}

// ---- registry ----------------------------------------------------------------------------------

TEST(MlpHostKernels, EveryKernelIsRegisteredUnderANameThatDemanglesToItsSignature) {
  // What each __global__ in mlp_kernels.cuh looks like to the Itanium demangler; a signature change
  // that is not mirrored in mlp_host_kernels.cc fails here.
  const std::map<std::string, std::string> expected = {
      {"_Z16mlp_init_uniformPfxyf", "mlp_init_uniform(float*, long long, unsigned long long, float)"},
      {"_Z21mlp_bias_relu_forwardPfPKfii", "mlp_bias_relu_forward(float*, float const*, int, int)"},
      {"_Z20mlp_bias_add_forwardPfPKfii", "mlp_bias_add_forward(float*, float const*, int, int)"},
      {"_Z17mlp_relu_backwardPfPKfx", "mlp_relu_backward(float*, float const*, long long)"},
      {"_Z13mlp_bias_gradPfPKfii", "mlp_bias_grad(float*, float const*, int, int)"},
      {"_Z19mlp_mse_output_gradPfS_PKfS1_iif",
       "mlp_mse_output_grad(float*, float*, float const*, float const*, int, int, float)"},
      {"_Z12mlp_loss_sumPfPKfif", "mlp_loss_sum(float*, float const*, int, float)"},
      {"_Z14mlp_sgd_updatePfPKfxf", "mlp_sgd_update(float*, float const*, long long, float)"},
  };
  const std::vector<std::string> names = mlp_kernel_names();
  EXPECT_EQ(names.size(), expected.size());
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size()) << "duplicate names";
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const HostKernel* k = KernelRegistry::global().find(name);
    ASSERT_NE(k, nullptr) << "not registered";
    EXPECT_EQ(k->name, name);
    EXPECT_NE(k->entry, nullptr);
    ASSERT_TRUE(expected.count(name)) << "unexpected kernel name";
    EXPECT_EQ(demangle(name), expected.at(name));
  }
  EXPECT_GE(KernelRegistry::global().size(), expected.size());
}

TEST(MlpHostKernels, UnknownNamesAreNotFound) {
  EXPECT_EQ(KernelRegistry::global().find("_Z14mlp_sgd_updatePfPKfxd"), nullptr);
  EXPECT_EQ(KernelRegistry::global().find(""), nullptr);
}

// ---- parameter layout --------------------------------------------------------------------------

struct Expect {
  uint32_t offset, size;
  bool read_only, pointer;
};

void expect_layout(const HostKernel& k, const std::vector<Expect>& want, uint32_t total) {
  ASSERT_EQ(k.layout.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    EXPECT_EQ(k.layout[i].offset, want[i].offset);
    EXPECT_EQ(k.layout[i].size, want[i].size);
    EXPECT_EQ(k.layout[i].read_only_pointer, want[i].read_only);
    EXPECT_EQ(k.layout[i].pointer, want[i].pointer);
  }
  EXPECT_EQ(k.param_bytes, total);
  // The slots the host backend checks at a launch: exactly the pointer parameters.
  std::vector<std::pair<uint32_t, uint32_t>> want_slots, got_slots;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i].pointer) want_slots.emplace_back(want[i].offset, static_cast<uint32_t>(i));
  for (const pos::host::PointerSlot& p : k.pointers) got_slots.emplace_back(p.offset, p.param);
  EXPECT_EQ(got_slots, want_slots);
}

TEST(KernelLayout, MseOutputGradHasPointersThenIntsAndConstPointersAreReadOnly) {
  const HostKernel* k = KernelRegistry::global().find("_Z19mlp_mse_output_gradPfS_PKfS1_iif");
  ASSERT_NE(k, nullptr);
  // (float* grad, float* sample_loss, const float* out, const float* target, int rows, int cols, float scale)
  expect_layout(*k, {{0, 8, false, true}, {8, 8, false, true}, {16, 8, true, true}, {24, 8, true, true},
                     {32, 4, false, false}, {36, 4, false, false}, {40, 4, false, false}},
                44);
}

void padded_kernel(int, const double*, char, long long, float, short*) {}

TEST(KernelLayout, ParametersSitAtTheirNaturalAlignmentWithPaddingBetween) {
  const HostKernel k = pos::host::make_host_kernel<&padded_kernel>("padded");
  // int@0, pad to 8, const double*@8, char@16, pad to 24, long long@24, float@32, pad to 40, short*@40.
  // The long long is as wide as a pointer but is none: only the types say which is which.
  expect_layout(k, {{0, 4, false, false}, {8, 8, true, true}, {16, 1, false, false}, {24, 8, false, false},
                    {32, 4, false, false}, {40, 8, false, true}},
                48);
}

struct TwoPointers {
  int n;
  float* out;
  const float* in;
  long long count;
};
struct NoPointers {
  long long a, b;
};

}  // namespace
// Descriptions live at namespace scope, where pos::host::PointerMembers may be specialized.
POS_HOST_POINTER_MEMBERS(TwoPointers, offsetof(TwoPointers, out), offsetof(TwoPointers, in));
POS_HOST_NO_POINTER_MEMBERS(NoPointers);
namespace {

void struct_kernel(char, TwoPointers, NoPointers, unsigned*) {}

TEST(KernelLayout, PointerMembersOfAStructParameterAreCheckedAtTheStructsOffsetPlusTheMembers) {
  const HostKernel k = pos::host::make_host_kernel<&struct_kernel>("structs");
  // char@0, TwoPointers@8 (32 bytes: out@+8, in@+16), NoPointers@40 (16 bytes), unsigned*@56.
  ASSERT_EQ(k.layout.size(), 4u);
  EXPECT_FALSE(k.layout[1].pointer);  // the struct itself is no pointer
  std::vector<std::pair<uint32_t, uint32_t>> got;
  for (const pos::host::PointerSlot& p : k.pointers) got.emplace_back(p.offset, p.param);
  EXPECT_EQ(got, (std::vector<std::pair<uint32_t, uint32_t>>{{16, 1}, {24, 1}, {56, 3}}));
  EXPECT_EQ(k.param_bytes, 64u);
}

TEST(KernelLayout, RegisteredEntryRunsTheKernelFromAPackedParameterBuffer) {
  const HostKernel* k = KernelRegistry::global().find("_Z14mlp_sgd_updatePfPKfxf");
  ASSERT_NE(k, nullptr);
  std::vector<float> w(1000, 1.0f), g(1000);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  float* wp = w.data();
  const float* gp = g.data();
  const long long n = 1000;
  const float lr = 0.5f;
  std::vector<std::byte> params(k->param_bytes);
  std::memcpy(params.data() + k->layout[0].offset, &wp, sizeof wp);
  std::memcpy(params.data() + k->layout[1].offset, &gp, sizeof gp);
  std::memcpy(params.data() + k->layout[2].offset, &n, sizeof n);
  std::memcpy(params.data() + k->layout[3].offset, &lr, sizeof lr);
  // Fewer threads than elements: the grid-stride loop must still cover everything.
  k->entry(pos::host::LaunchGeometry{{3}, {7}, 0}, params.data());
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(w[i], 1.0f - 0.5f * static_cast<float>(i)) << i;
}

// ---- cpu_blas ----------------------------------------------------------------------------------

struct Gemm {
  BlasOp ta, tb;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
};

// op(X)(r, c) of a column-major X.
float at(BlasOp op, const std::vector<float>& x, int ld, int r, int c) {
  return op == BlasOp::kN ? x[r + static_cast<size_t>(c) * ld] : x[c + static_cast<size_t>(r) * ld];
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Checks every C element against a double-precision sum, relative to the size of its terms.
void expect_close_to_double_reference(const Gemm& g, const std::vector<float>& A, const std::vector<float>& B,
                                      const std::vector<float>& C0, const std::vector<float>& C) {
  for (int j = 0; j < g.n; ++j) {
    for (int i = 0; i < g.m; ++i) {
      double sum = 0.0, mag = 0.0;
      for (int p = 0; p < g.k; ++p) {
        const double prod = static_cast<double>(at(g.ta, A, g.lda, i, p)) * at(g.tb, B, g.ldb, p, j);
        sum += prod;
        mag += std::fabs(prod);
      }
      const double c0 = C0[i + static_cast<size_t>(j) * g.ldc];
      const double want = g.alpha * sum + g.beta * c0;
      const double scale = std::fabs(g.alpha) * mag + std::fabs(g.beta * c0);
      const double got = C[i + static_cast<size_t>(j) * g.ldc];
      ASSERT_LE(std::fabs(got - want), 1e-5 * scale) << "C(" << i << "," << j << ")";
    }
  }
}

void run_and_check(const Gemm& g, uint32_t seed) {
  const int a_cols = g.ta == BlasOp::kN ? g.k : g.m;
  const int b_cols = g.tb == BlasOp::kN ? g.n : g.k;
  const std::vector<float> A = random_floats(static_cast<size_t>(g.lda) * a_cols, seed);
  const std::vector<float> B = random_floats(static_cast<size_t>(g.ldb) * b_cols, seed + 1);
  const std::vector<float> C0 = random_floats(static_cast<size_t>(g.ldc) * g.n, seed + 2);
  std::vector<float> C = C0;
  pos::host::sgemm(g.ta, g.tb, g.m, g.n, g.k, g.alpha, A.data(), g.lda, B.data(), g.ldb, g.beta, C.data(), g.ldc);
  expect_close_to_double_reference(g, A, B, C0, C);
  // Rows between m and ldc are padding that a GEMM must leave alone.
  for (int j = 0; j < g.n; ++j)
    for (int i = g.m; i < g.ldc; ++i) ASSERT_EQ(C[i + static_cast<size_t>(j) * g.ldc], C0[i + static_cast<size_t>(j) * g.ldc]);
}

// Sizes straddle the packing blocks (MC=128, KC=256, NC=256, 8x4 micro-tiles) and their remainders.
TEST(CpuBlas, SgemmNNMatchesADoublePrecisionReference) {
  run_and_check({BlasOp::kN, BlasOp::kN, 137, 261, 300, 140, 301, 139, 1.0f, 0.0f}, 1);
  run_and_check({BlasOp::kN, BlasOp::kN, 5, 3, 7, 5, 7, 5, -0.75f, 0.5f}, 2);
}

TEST(CpuBlas, SgemmTNMatchesADoublePrecisionReference) {
  run_and_check({BlasOp::kT, BlasOp::kN, 129, 33, 513, 515, 513, 130, 0.5f, 1.0f}, 3);
}

TEST(CpuBlas, SgemmNTMatchesADoublePrecisionReference) {
  run_and_check({BlasOp::kN, BlasOp::kT, 67, 259, 64, 70, 260, 67, 1.0f, -2.0f}, 4);
}

TEST(CpuBlas, SgemmTTMatchesADoublePrecisionReference) {
  run_and_check({BlasOp::kT, BlasOp::kT, 41, 19, 257, 257, 21, 45, 2.0f, 0.25f}, 5);
}

TEST(CpuBlas, ConjugateTransposeOfRealDataIsTranspose) {
  const Gemm g{BlasOp::kC, BlasOp::kC, 9, 11, 13, 13, 11, 9, 1.0f, 0.0f};
  const std::vector<float> A = random_floats(13 * 9, 6), B = random_floats(11 * 13, 7);
  std::vector<float> c_conj(9 * 11), c_trans(9 * 11);
  pos::host::sgemm(BlasOp::kC, BlasOp::kC, g.m, g.n, g.k, 1.0f, A.data(), g.lda, B.data(), g.ldb, 0.0f,
                   c_conj.data(), g.ldc);
  pos::host::sgemm(BlasOp::kT, BlasOp::kT, g.m, g.n, g.k, 1.0f, A.data(), g.lda, B.data(), g.ldb, 0.0f,
                   c_trans.data(), g.ldc);
  EXPECT_EQ(0, std::memcmp(c_conj.data(), c_trans.data(), c_conj.size() * sizeof(float)));
}

TEST(CpuBlas, EachElementIsAFloatSumInIncreasingKOrderBitForBit) {
  // The determinism contract: acc = 0; acc += a*b for k = 0..K-1 in float; C = alpha*acc + beta*C.
  // k spans several k blocks so the parked partial sums are exercised.
  const int m = 23, n = 10, k = 700;
  const float alpha = 0.75f, beta = -1.5f;
  const std::vector<float> A = random_floats(static_cast<size_t>(k) * m, 8);  // op(A) = A^T: A is k x m
  const std::vector<float> B = random_floats(static_cast<size_t>(k) * n, 9);  // B is k x n
  const std::vector<float> C0 = random_floats(static_cast<size_t>(m) * n, 10);
  std::vector<float> C = C0;
  pos::host::sgemm(BlasOp::kT, BlasOp::kN, m, n, k, alpha, A.data(), k, B.data(), k, beta, C.data(), m);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      // volatile: each product is rounded to float even if this file is built with FMA contraction.
      float acc = 0.0f;
      for (int p = 0; p < k; ++p) {
        const volatile float prod = A[p + static_cast<size_t>(i) * k] * B[p + static_cast<size_t>(j) * k];
        acc = acc + prod;
      }
      const volatile float scaled = alpha * acc;
      const volatile float old = beta * C0[i + static_cast<size_t>(j) * m];
      const float want = scaled + old;
      ASSERT_EQ(std::memcmp(&want, &C[i + static_cast<size_t>(j) * m], sizeof want), 0) << i << "," << j;
    }
  }
}

TEST(CpuBlas, StridedBatchedMatchesADoublePrecisionReferencePerBatch) {
  const Gemm g{BlasOp::kT, BlasOp::kN, 31, 17, 45, 47, 45, 33, 1.25f, 0.5f};
  const long long sa = 47LL * 31 + 5, sb = 45LL * 17 + 3, sc = 33LL * 17 + 7;
  const int batch = 3;
  const std::vector<float> A = random_floats(static_cast<size_t>(sa) * batch, 11);
  const std::vector<float> B = random_floats(static_cast<size_t>(sb) * batch, 12);
  const std::vector<float> C0 = random_floats(static_cast<size_t>(sc) * batch, 13);
  std::vector<float> C = C0;
  pos::host::sgemm_strided_batched(g.ta, g.tb, g.m, g.n, g.k, g.alpha, A.data(), g.lda, sa, B.data(), g.ldb, sb,
                                   g.beta, C.data(), g.ldc, sc, batch);
  for (int b = 0; b < batch; ++b) {
    SCOPED_TRACE("batch " + std::to_string(b));
    auto slice = [b](const std::vector<float>& v, long long stride, size_t len) {
      return std::vector<float>(v.begin() + stride * b, v.begin() + stride * b + static_cast<long long>(len));
    };
    expect_close_to_double_reference(g, slice(A, sa, 47 * 31), slice(B, sb, 45 * 17), slice(C0, sc, 33 * 17),
                                     slice(C, sc, 33 * 17));
  }
  // The gaps between batches are not part of any matrix and must be untouched.
  for (int b = 0; b < batch; ++b)
    for (long long i = 33LL * 17; i < sc; ++i) ASSERT_EQ(C[b * sc + i], C0[b * sc + i]);
}

TEST(CpuBlas, BetaZeroOverwritesCWithoutReadingItsNaNs) {
  const int m = 19, n = 7, k = 5;
  const std::vector<float> A = random_floats(m * k, 14), B = random_floats(k * n, 15);
  std::vector<float> C(m * n, std::numeric_limits<float>::quiet_NaN()), Z(m * n, 0.0f);
  pos::host::sgemm(BlasOp::kN, BlasOp::kN, m, n, k, 1.0f, A.data(), m, B.data(), k, 0.0f, C.data(), m);
  pos::host::sgemm(BlasOp::kN, BlasOp::kN, m, n, k, 1.0f, A.data(), m, B.data(), k, 0.0f, Z.data(), m);
  for (int i = 0; i < m * n; ++i) {
    ASSERT_FALSE(std::isnan(C[i])) << i;
    ASSERT_EQ(C[i], Z[i]) << i;
  }
}

TEST(CpuBlas, EmptyShapesLeaveCUntouchedAndKZeroScalesCByBeta) {
  const std::vector<float> A(16, 1.0f), B(16, 1.0f);
  std::vector<float> C(16, 3.0f);
  pos::host::sgemm(BlasOp::kN, BlasOp::kN, 0, 4, 4, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4);
  pos::host::sgemm(BlasOp::kN, BlasOp::kN, 4, -1, 4, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4);
  pos::host::sgemm(BlasOp::kN, BlasOp::kN, 4, 4, -2, 1.0f, A.data(), 4, B.data(), 4, 0.0f, C.data(), 4);
  for (float c : C) ASSERT_EQ(c, 3.0f);
  // BLAS (and cuBLAS) semantics: with no products, C = beta*C.
  pos::host::sgemm(BlasOp::kN, BlasOp::kN, 4, 4, 0, 1.0f, A.data(), 4, B.data(), 4, 0.5f, C.data(), 4);
  for (float c : C) ASSERT_EQ(c, 1.5f);
}

// ---- MLP reference -----------------------------------------------------------------------------

std::string run_reference_to_string(const mlp::MlpConfig& cfg) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  EXPECT_NE(f, nullptr);
  if (f == nullptr) return {};
  EXPECT_EQ(run_mlp_reference(cfg, f), 0);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

std::vector<double> losses_of(const std::string& out) {
  std::vector<double> losses;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int step = -1;
    double loss = 0;
    if (std::sscanf(line.c_str(), "step %d loss %lf", &step, &loss) == 2) {
      EXPECT_EQ(step, static_cast<int>(losses.size()));
      losses.push_back(loss);
    }
  }
  return losses;
}

TEST(MlpReference, TwoRunsPrintByteIdenticalOutput) {
  const mlp::MlpConfig cfg;
  const std::string a = run_reference_to_string(cfg);
  const std::string b = run_reference_to_string(cfg);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  // The last line is the checksum: 16 hex digits, then the parameter sum.
  const std::string last = a.substr(a.rfind('\n', a.size() - 2) + 1);
  char hex[17] = {};
  double sum = 0;
  ASSERT_EQ(std::sscanf(last.c_str(), "checksum %16[0-9a-f] sum %lf", hex, &sum), 2) << last;
  EXPECT_EQ(std::strlen(hex), 16u);
  EXPECT_TRUE(std::isfinite(sum));
}

TEST(MlpReference, LossFallsOverTwentyDefaultSteps) {
  const mlp::MlpConfig cfg;
  ASSERT_EQ(cfg.steps, 20);
  const std::vector<double> losses = losses_of(run_reference_to_string(cfg));
  ASSERT_EQ(losses.size(), 20u);
  for (double l : losses) ASSERT_TRUE(std::isfinite(l));
  double tail = 0;
  for (size_t i = 15; i < 20; ++i) tail += losses[i] / 5;
  // Batch-to-batch noise is a few percent; learning must do much better than that.
  EXPECT_LT(tail, 0.5 * losses[0]);
  EXPECT_LT(losses[19], losses[0]);
}

TEST(MlpReference, DifferentSeedsGiveDifferentChecksums) {
  mlp::MlpConfig a, b;
  a.steps = b.steps = 2;
  b.seed = 2;
  const std::string oa = run_reference_to_string(a), ob = run_reference_to_string(b);
  EXPECT_NE(oa.substr(oa.rfind("checksum")), ob.substr(ob.rfind("checksum")));
}

// ---- arguments ---------------------------------------------------------------------------------

mlp::ParseResult parse(std::vector<const char*> args, mlp::MlpConfig* cfg) {
  args.insert(args.begin(), "prog");
  return mlp::parse_args(static_cast<int>(args.size()), args.data(), cfg);
}

TEST(MlpArgs, ParamMibPicksAHiddenWidthWithinOnePercentOfTheTarget) {
  mlp::MlpConfig cfg;
  ASSERT_TRUE(parse({"--param-mib", "64", "--steps", "3"}, &cfg).ok);
  EXPECT_EQ(cfg.steps, 3);
  const double mib = static_cast<double>(mlp::parameter_bytes(cfg)) / (1 << 20);
  EXPECT_NEAR(mib, 64.0, 0.64);
  ASSERT_TRUE(parse({"--param-mib", "40960", "--layers", "4"}, &cfg).ok);  // 40 GiB
  EXPECT_NEAR(static_cast<double>(mlp::parameter_bytes(cfg)) / (1 << 20), 40960.0, 409.6);
}

TEST(MlpArgs, BadOrUnknownArgumentsAreRejectedWithAReason) {
  mlp::MlpConfig cfg;
  const std::vector<std::vector<const char*>> bad = {
      {"--bogus", "1"}, {"--hidden", "0"}, {"--hidden", "12x"}, {"--batch"}, {"--lr", "nan"}, {"--lr", "-1"},
      {"--seed", "-3"}, {"--layers", "-1"}, {"positional"},   {"--param-mib", "8", "--hidden", "4"},
      {"--layers", "0", "--param-mib", "8"}};
  for (const auto& args : bad) {
    const mlp::ParseResult r = parse(args, &cfg);
    EXPECT_FALSE(r.ok) << args[0];
    EXPECT_FALSE(r.help);
    EXPECT_FALSE(r.error.empty()) << args[0];
  }
  EXPECT_TRUE(parse({"--help"}, &cfg).help);
}

}  // namespace

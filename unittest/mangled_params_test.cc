// mangled_params_test.cc — constness of kernel pointer parameters read from mangled names (the CUDA
// backend's source for In edges). Names below are what g++/nvcc emit for the signatures in comments.
#include "pos/backends/cuda/mangled_params.h"

#include <gtest/gtest.h>

namespace pos::cudabk {
namespace {

using V = std::vector<bool>;

TEST(MangledParams, PlainKernelsReportTheirConstPointers) {
  EXPECT_EQ(const_pointer_params("_Z9test_axpyPfPKffi"), (V{false, true, false, false}));
  EXPECT_EQ(const_pointer_params("_Z9test_noopi"), (V{false}));
  EXPECT_EQ(const_pointer_params("_Z17test_scale_struct9ScaleArgs"), (V{false}));
  EXPECT_EQ(const_pointer_params("_Z2k7v"), V{});  // k7()
  // k6(unsigned long long, const unsigned*, long, const void*)
  EXPECT_EQ(const_pointer_params("_Z2k6yPKjlPKv"), (V{false, true, false, true}));
}

TEST(MangledParams, SubstitutionsResolveToTheTypesTheyName) {
  // ns::k1(const float*, const float*, float*): S1_ is PKf
  EXPECT_EQ(const_pointer_params("_ZN2ns2k1EPKfS1_Pf"), (V{true, true, false}));
  // ns::k2(const float*, float*, const float*, int, const double*, S, const S*)
  EXPECT_EQ(const_pointer_params("_ZN2ns2k2EPKfPfS1_iPKd1SPKS5_"), (V{true, false, true, false, true, false, true}));
  // k5(ns::V<float>, const ns::V<float>*, ns::V<float>*, const char*, const char*)
  EXPECT_EQ(const_pointer_params("_Z2k5N2ns1VIfEEPKS1_PS1_PKcS6_"), (V{false, true, false, true, true}));
}

TEST(MangledParams, TemplateKernelsSkipTheReturnTypeAndResolveTemplateParameters) {
  // k3<float>(const float*, float*, int)
  EXPECT_EQ(const_pointer_params("_Z2k3IfEvPKT_PS0_i"), (V{true, false, false}));
  // k4<double, 4>(double*, const double* __restrict__, const volatile double*)
  EXPECT_EQ(const_pointer_params("_Z2k4IdLi4EEvPT_PKS0_PVKS0_"), (V{false, true, true}));
}

TEST(MangledParams, NamesItCannotReadGiveNoAnswerRatherThanAGuess) {
  EXPECT_FALSE(const_pointer_params("coeffs").has_value());           // not mangled (extern "C")
  EXPECT_FALSE(const_pointer_params("_Z").has_value());
  EXPECT_FALSE(const_pointer_params("_Z3fooPA4_f").has_value());      // array parameter
  EXPECT_FALSE(const_pointer_params("_Z3fooS9_").has_value());        // substitution out of range
  EXPECT_FALSE(const_pointer_params("_Z999foo").has_value());         // length past the end
  EXPECT_FALSE(const_pointer_params("_Z3fooIT_EvT0_").has_value());   // template parameter out of range
}

}  // namespace
}  // namespace pos::cudabk

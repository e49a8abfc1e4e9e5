// test_kernels.cc — registers the test kernels with the host kernel library.
// Linked whole into the test binaries and the pipeline bench.
#define POS_TEST_KERNELS_DEFINE
#include "unittest/test_kernels.h"

namespace {
POS_HOST_KERNEL(r1, &test_axpy, kTestAxpyName);
POS_HOST_KERNEL(r2, &test_scale_struct, kTestScaleStructName);
POS_HOST_KERNEL(r3, &test_fill, kTestFillName);
POS_HOST_KERNEL(r4, &test_noop, kTestNoopName);
POS_HOST_KERNEL(r5, &test_peek, kTestPeekName);
POS_HOST_KERNEL(r6, &test_poke, kTestPokeName);
POS_HOST_KERNEL(r7, &test_fault, kTestFaultName);
}  // namespace

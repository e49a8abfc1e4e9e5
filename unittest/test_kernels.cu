// test_kernels.cu — the API tests' kernels compiled by nvcc into a fatbin that the `gpu` suite
// registers instead of the host suite's stand-in blob (same source as the host versions).
#include "unittest/test_kernels.h"

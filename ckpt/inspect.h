// inspect.h — renders an opened image for people (text) and programs (JSON): `pos-cli inspect`.
// A library function so that the CLI stays a thin main and the output is testable.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ckpt/image.h"

namespace pos::ckpt {

struct DescribeOptions {
  bool json = false;
  // Counts and bytes per resource type instead of one line (or object) per handle: for images of
  // thousands of buffers.
  bool summary = false;
};
std::string describe_image(const ImageReader& image, const DescribeOptions& options);
inline std::string describe_image(const ImageReader& image, bool json) {
  return describe_image(image, DescribeOptions{json, false});
}

// What verify_image read.
struct VerifyReport {
  uint64_t images = 0;  // this one and its parents
  uint64_t blobs = 0, chunks = 0, bytes = 0;
};
// Reads every blob of the image and of its parents and checks every chunk's checksum (open_dir
// checks the structure; blob bytes are otherwise checked only as a restore reads them). The first
// bad chunk is an error naming the image, the handle and the offset. `progress(done, total)` is
// called after each chunk, in bytes.
StatusOr<VerifyReport> verify_image(const ImageReader& image,
                                    const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace pos::ckpt

// inspect.h — renders an opened image for people (text) and programs (JSON): `pos-cli inspect`.
// A library function so that the CLI stays a thin main and the output is testable.
#pragma once

#include <string>

#include "ckpt/image.h"

namespace pos::ckpt {

std::string describe_image(const ImageReader& image, bool json);

}  // namespace pos::ckpt

// status.h — POS's one error type: a code, the API error a real CUDA stack would return, a message.
// Every fallible call in POS returns Status or StatusOr<T>; the API error survives to the app.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "pos/base/cuda_errors.h"

namespace pos {

// Broad category: what kind of failure, independent of the API family.
enum class Code : uint8_t {
  kOk = 0,
  kInvalidArgument,     // bad value from a client, file or CLI
  kNotFound,            // unknown handle, address, client, api id
  kOutOfMemory,         // device memory or quota exhausted
  kBusy,                // one-at-a-time operation already running
  kUnavailable,         // client inactive / shutting down
  kFailedPrecondition,  // right request, wrong state
  kOutOfRange,          // offsets / sizes past an allocation
  kNotReady,            // async work still pending (cudaErrorNotReady)
  kCorrupt,             // damaged image or frame
  kUnsupported,         // valid but not implemented by this backend
  kInternal,            // broken invariant inside POS
};

std::string_view code_name(Code c);

// Sixteen bytes: an ok Status (every call on the hot path returns several) is two stores to make
// and one test to destroy; only an error carries its message, on the heap.
class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  // api_error: the cudaError_t (or cublasStatus_t for cuBLAS APIs) the app must see.
  Status(Code code, int32_t api_error, std::string message)
      : code_(code), api_error_(api_error),
        message_(message.empty() ? nullptr : std::make_unique<std::string>(std::move(message))) {}
  Status(const Status& o) : code_(o.code_), api_error_(o.api_error_), message_(copy_of(o.message_)) {}
  Status& operator=(const Status& o) {
    if (this != &o) code_ = o.code_, api_error_ = o.api_error_, message_ = copy_of(o.message_);
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }
  // Build from a CUDA runtime error code; the category is derived from it.
  static Status Cuda(int32_t cuda_error, std::string message);
  static Status Cublas(int32_t cublas_status, std::string message);
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, cuda::kErrorInvalidValue, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, cuda::kErrorInvalidResourceHandle, std::move(m)}; }
  static Status Busy(std::string m) { return {Code::kBusy, cuda::kErrorNotPermitted, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, cuda::kErrorNotReady, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, cuda::kErrorUnknown, std::move(m)}; }
  static Status Unsupported(std::string m) { return {Code::kUnsupported, cuda::kErrorNotSupported, std::move(m)}; }
  static Status Corrupt(std::string m) { return {Code::kCorrupt, cuda::kErrorInvalidValue, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {Code::kFailedPrecondition, cuda::kErrorNotPermitted, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  int32_t api_error() const { return api_error_; }
  const std::string& message() const { return message_ != nullptr ? *message_ : empty_message(); }
  std::string to_string() const;

  // Prefix the message with context ("cudaMemcpy: ..."), keeping the codes.
  Status with_context(std::string_view ctx) const;

 private:
  static const std::string& empty_message();
  static std::unique_ptr<std::string> copy_of(const std::unique_ptr<std::string>& m) {
    return m ? std::make_unique<std::string>(*m) : nullptr;
  }

  Code code_ = Code::kOk;
  int32_t api_error_ = 0;
  std::unique_ptr<std::string> message_;  // nullptr when empty
};
static_assert(sizeof(Status) == 16);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {}  // NOLINT: must be an error
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace pos

#define POS_RETURN_IF_ERROR(expr)          \
  do {                                     \
    ::pos::Status pos_status_ = (expr);    \
    if (!pos_status_.ok()) return pos_status_; \
  } while (0)

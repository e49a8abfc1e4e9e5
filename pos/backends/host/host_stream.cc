// host_stream.cc — the stream executor loop: wait for dependencies, run, publish completion.
// Completion is a counter plus a doorbell, so any number of threads can wait for a sequence.
#include "pos/backends/host/host_stream.h"

#include <cstring>

namespace pos::host {

HostStream::HostStream(uint32_t flags, int32_t priority, uint64_t spin_ns)
    : flags_(flags), priority_(priority), spin_ns_(spin_ns) {
  thread_ = std::thread([this] {
    name_this_thread("pos-hoststream");
    run();
  });
}

HostStream::~HostStream() {
  wait_idle();
  stop_.store(true, std::memory_order_release);
  submit_bell_.ring();
  thread_.join();
}

uint64_t HostStream::enqueue(std::function<void()> fn, std::vector<StreamDep> deps) {
  Op op;
  op.inline_fn = nullptr;
  op.slow = new Slow{std::move(fn), std::move(deps)};
  return push(op);
}

uint64_t HostStream::enqueue_inline(InlineFn fn, const void* bytes, size_t n) {
  if (n > kInlineBytes) {
    std::vector<std::byte> copy(static_cast<const std::byte*>(bytes), static_cast<const std::byte*>(bytes) + n);
    return enqueue([fn, c = std::move(copy)] { fn(c.data()); });
  }
  Op op;
  op.inline_fn = fn;
  op.slow = nullptr;
  std::memcpy(op.bytes, bytes, n);
  return push(op);
}

uint64_t HostStream::push(const Op& op) {
  const uint64_t seq = submitted_.load(std::memory_order_relaxed) + 1;
  submitted_.store(seq, std::memory_order_release);
  while (!q_.push(op)) {  // full: the stream is 1024 ops behind; wait for it
    submit_bell_.ring();
    spin_then_block(done_bell_, spin_ns_, [&] { return q_.write_available() > 0; });
  }
  submit_bell_.ring();
  return seq;
}

void HostStream::wait_for(uint64_t seq) {
  spin_then_block(done_bell_, spin_ns_, [&] { return completed_.load(std::memory_order_acquire) >= seq; });
}

void HostStream::run() {
  for (;;) {
    Op op;
    if (q_.pop(op)) {
      if (op.slow != nullptr) {
        for (const StreamDep& d : op.slow->deps) d.stream->wait_for(d.seq);
        op.slow->fn();
        delete op.slow;
      } else {
        op.inline_fn(op.bytes);
      }
      completed_.fetch_add(1, std::memory_order_acq_rel);
      done_bell_.ring();
      continue;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    spin_then_block(submit_bell_, spin_ns_, [&] { return q_.read_available() > 0 || stop_.load(); });
  }
}

}  // namespace pos::host

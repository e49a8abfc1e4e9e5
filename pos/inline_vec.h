// inline_vec.h — a small vector with inline storage, for per-call lists (edges, parameters).
// The pipeline's hot path must not allocate; lists longer than N spill to the heap.
#pragma once

#include <cstddef>
#include <vector>

namespace pos {

template <typename T, size_t N>
class InlineVec {
 public:
  void push_back(const T& v) {
    if (n_ < N) {
      inline_[n_++] = v;
    } else {
      spill_.push_back(v);
      ++n_;
    }
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](size_t i) { return i < N ? inline_[i] : spill_[i - N]; }
  const T& operator[](size_t i) const { return i < N ? inline_[i] : spill_[i - N]; }
  void clear() {
    if (n_ > N) spill_.clear();  // otherwise its line is not touched
    n_ = 0;
  }
  template <typename F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < n_; ++i) f((*this)[i]);
  }

 private:
  size_t n_ = 0;  // first: the count and the first elements share a cache line
  T inline_[N]{};
  std::vector<T> spill_;
};

}  // namespace pos

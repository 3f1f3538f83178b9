// Open-addressing (linear probing) tables for the vocabulary and the merges.
#include "internal.h"

namespace kvboost::tok {
namespace {

size_t slots_for(size_t n) {
  size_t s = 16;
  while (s < n * 2) s <<= 1;  // load factor <= 0.5
  return s;
}

uint64_t mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

}  // namespace

void FlatStrIndex::reserve(size_t n) {
  keys_.reserve(n);
  ids_.reserve(n);
  hashes_.reserve(n);
  if (slots_for(n) > slots_.size()) rehash(slots_for(n));
}

void FlatStrIndex::rehash(size_t n_slots) {
  slots_.assign(n_slots, -1);
  const size_t mask = n_slots - 1;
  for (size_t k = 0; k < keys_.size(); ++k) {
    size_t i = hashes_[k] & mask;
    while (slots_[i] >= 0) i = (i + 1) & mask;
    slots_[i] = static_cast<int32_t>(k);
  }
}

bool FlatStrIndex::insert(std::string key, int32_t id) {
  if (slots_.empty() || (keys_.size() + 1) * 2 > slots_.size()) rehash(slots_for(keys_.size() + 1));
  const uint64_t h = std::hash<std::string_view>{}(key);
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  for (; slots_[i] >= 0; i = (i + 1) & mask)
    if (hashes_[slots_[i]] == h && keys_[slots_[i]] == key) return false;
  slots_[i] = static_cast<int32_t>(keys_.size());
  keys_.push_back(std::move(key));
  ids_.push_back(id);
  hashes_.push_back(h);
  return true;
}

std::optional<int32_t> FlatStrIndex::find(std::string_view key) const {
  if (slots_.empty()) return std::nullopt;
  const uint64_t h = std::hash<std::string_view>{}(key);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask; slots_[i] >= 0; i = (i + 1) & mask) {
    int32_t k = slots_[i];
    if (hashes_[k] == h && keys_[k] == key) return ids_[k];
  }
  return std::nullopt;
}

void FlatPairMap::reserve(size_t n) {
  if (slots_for(n) > slots_.size()) rehash(slots_for(n));
}

void FlatPairMap::rehash(size_t n_slots) {
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(n_slots, Slot{0, {0, 0}, false});
  n_ = 0;
  for (const Slot& s : old)
    if (s.used) insert_or_assign(s.key, s.value.first, s.value.second);
}

void FlatPairMap::insert_or_assign(uint64_t key, int32_t rank, int32_t new_id) {
  if (slots_.empty() || (n_ + 1) * 2 > slots_.size()) rehash(slots_for(n_ + 1));
  const size_t mask = slots_.size() - 1;
  size_t i = mix64(key) & mask;
  for (; slots_[i].used; i = (i + 1) & mask) {
    if (slots_[i].key == key) {
      slots_[i].value = {rank, new_id};
      return;
    }
  }
  slots_[i] = Slot{key, {rank, new_id}, true};
  ++n_;
}

const std::pair<int32_t, int32_t>* FlatPairMap::find(uint64_t key) const {
  if (slots_.empty()) return nullptr;
  const size_t mask = slots_.size() - 1;
  for (size_t i = mix64(key) & mask; slots_[i].used; i = (i + 1) & mask)
    if (slots_[i].key == key) return &slots_[i].value;
  return nullptr;
}

}  // namespace kvboost::tok

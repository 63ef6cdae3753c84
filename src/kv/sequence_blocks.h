#pragma once
// A sequence's KV state cut the way the tiers keep it (DESIGN §4):
//  * global blocks: for each complete block of B tokens, the compressed entries every kv-source
//    layer made for it (KV-FP4 main + MXFP4 index key) — what the host cache and the persistent
//    store hold, shared between requests with the same prefix;
//  * the tail: everything else a sequence needs to go on exactly — the SWA rings, the entries of
//    the incomplete last block, the compressor's open groups, the bounded-replay floor — what the
//    SWA pool holds for minutes.
// B must be a multiple of every compression ratio (PrefixKeys::block_tokens guarantees it), so a
// block owns whole entries.
#include <cstdint>
#include <span>
#include <vector>

#include "forward/state_view.h"

namespace dsv41 {

// The size of every global block's payload: per kv-source layer, B / ratio entries of KV-FP4 main KV
// and MXFP4 index key.
int64_t global_block_bytes(const Config& config, int block_tokens);

// The global-KV payload of block `block` (tokens [block·B, (block+1)·B)) of a state holding them
// (a view saved in part holds the blocks from its entries' first on).
std::vector<uint8_t> global_block(const Config& config, const StateView& state, int64_t block, int block_tokens);
std::vector<uint8_t> global_block(const Config& config, const SequenceState& state, int64_t block, int block_tokens);

// Everything beyond the state's complete blocks.
std::vector<uint8_t> sequence_tail(const Config& config, const StateView& state, int block_tokens);
std::vector<uint8_t> sequence_tail(const Config& config, const SequenceState& state, int block_tokens);

// The state of a sequence from its global blocks' payloads (in order) and, optionally, its tail, as
// views of them (checked: a torn or foreign payload is refused by name). Without a tail the state
// holds the blocks' global KV only (length = blocks · B, every ring zero): an SWA miss.
StateView view_sequence(const Config& config, std::span<const Bytes> blocks, int block_tokens,
                        const std::vector<uint8_t>* tail = nullptr);

// The same state as a host SequenceState, each cache allocated once at its final size.
SequenceState restore_sequence(const Config& config, std::span<const Bytes> blocks, int block_tokens,
                               const std::vector<uint8_t>* tail = nullptr);

}  // namespace dsv41

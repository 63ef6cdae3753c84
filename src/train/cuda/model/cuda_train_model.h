#pragma once
// The V4.1 network's training forward and backward on the device (docs/training.md, "The CUDA
// trainer"): forward/network.h's layer loop run by a CUDA training op set over one packed sequence
// from position 0, the mirror of train/model/train_model.h's TrainModel<float>, each op
// the CUDA op set's (src/train/cuda) with its backward recorded on the tape. The parameters are
// DeviceParameters' (their gradients accumulate there, for the CUDA optimizer).
//
// Written so far (docs/training.md says what is next): the embedding, mHC with Sinkhorn, attention
// with its sink over the window and CSA2's compressed entries (the compressor, the indexer's top-k
// chosen on the host by the engine's own selection from the device's scores, the candidate
// source's pool, the indexer's distillation loss), QAT (SWA-FP8, KV-FP4, MXFP4), Engram, the MoE
// (the gate's product in fp32), the head and the next-token loss; DSpark's drafter with the paper's
// loss; decoder bounded replay (served calls). Not written: imposed layer inputs (layer-local parity).
//
// Products on bf16 operands with fp32 accumulation (linear.h): the masters' bf16 copies and each
// activation cast as it enters a product, straight-through, as autocast has it (or, Operands::Fp32,
// on the fp32 values themselves); everything else in fp32. The host keeps what it decides: each
// row's window lists and the MoE's rows per expert (one download of the gate's choices a layer).
// Its uploads go through a page-locked ring (pinned_uploads.h): they return at once, and the host
// runs ahead of the device from one download to the next.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "forward/forward.h"
#include "train/cuda/model/device_parameters.h"
#include "train/cuda/pinned_uploads.h"
#include "train/model/tape.h"
#include "train/model/train_model.h"

namespace dsv41::train_cuda {

class CudaTrainOps;

class CudaTrainModel {
 public:
  // operands: the products' precision (linear.h): Bf16 to train, Fp32 for the parity tests.
  CudaTrainModel(train::Parameters<float>& params, DeviceParameters& device, train::TrainOptions options = {},
                 Operands operands = Operands::Bf16);
  ~CudaTrainModel();

  // A batch of sequences of one length L (train_model.h's TrainSequence: tokens [L + 1], the inputs
  // the first L, each row's target the next; engram_ids [L, engram layers, hash columns] of the
  // inputs, forward.h's layout, nullptr without Engram, on the host), run as one: their rows one
  // after the other through every op, each sequence's attention, compressor, indexer and losses
  // its own. Records the backward. Returns each sequence's L_lm, L_indexer and L_dspark
  // (downloaded), each as TrainModel<float>::forward gives it for that sequence alone.
  //
  // With anchors (train_model.h's dspark_anchors), DSpark's drafter runs a block at each after the
  // target (its stages' experts recorded and imposed in the trace's layers n_layers ..
  // n_total_layers − 1); its loss's labels are the forward's own.
  //
  // With served calls (train_model.h's replay_calls), decoder bounded replay as the CPU trainer
  // simulates it: the cut rows leave at the decoder start, the decoder's windows stop at each row's
  // floor, L_lm is the mean over the rows the decoder runs and logits() holds those rows.
  //
  // With a trace (its rows the batch's, sequence after sequence; a top-k's entries each sequence's
  // own): records each layer's experts (route_experts) and each index source's top-k, and imposes
  // its forced_experts and forced_topk (the choices held, as the CPU trainer's parity tests hold
  // them).
  std::vector<train::Losses> forward(std::span<const train::TrainSequence> batch, Trace* trace = nullptr);
  // A batch of one.
  train::Losses forward(std::span<const int64_t> tokens, const int64_t* engram_ids = nullptr, Trace* trace = nullptr,
                        std::span<const int64_t> anchors = {}, std::span<const train::ServedCall> calls = {});
  // Adds the gradient of Σ over the last forward's sequences of lm_weight · L_lm + indexer_weight ·
  // L_indexer + dspark_weight · L_dspark into the device gradients (zeroed by the caller: batches
  // accumulate).
  void backward(float lm_weight = 1.0f, float indexer_weight = 1.0f, float dspark_weight = 1.0f);
  // The last forward's logits [rows, vocab], sequence by sequence (with served calls, the rows the
  // decoder ran), downloaded.
  std::vector<float> logits() const;
  // Rows routed to each expert of each layer since the last reset ([layer][expert]), as the CPU's.
  const std::vector<std::vector<int64_t>>& expert_load() const { return expert_load_; }
  void reset_expert_load();
  // The page-locked ring every upload of the model goes through; its stream is the model's.
  PinnedUploads& uploads() { return uploads_; }

  struct Constants;  // what every forward reads (cuda_train_model.cpp)

 private:
  train::Parameters<float>& params_;
  DeviceParameters& device_;
  train::TrainOptions options_;
  train::Tape tape_;
  Blas blas_;
  PinnedUploads uploads_;  // before constants_, which it uploads
  std::unique_ptr<Constants> constants_;
  std::unique_ptr<CudaTrainOps> ops_, drafter_;
  std::vector<std::vector<int64_t>> expert_load_;
};

}  // namespace dsv41::train_cuda

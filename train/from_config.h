// A CREDIT config (data/credit_config.h) into a fine-tuning run: `wxe finetune CONFIG.yml`.
#pragma once
#include <functional>
#include <string>

#include "data/credit_config.h"
#include "train/trainer.h"

namespace wxe {

// `wxe finetune CONFIG.yml`: the config's data (samples over start_datetime..end_datetime),
// save_loc, forecast_len, trainer and loss keys into fc, except the values whose command-line
// flag was given (given("--lr") true: the flag overrides). Prints the config's warnings;
// writes channel_schema.yaml into the save folder (rank 0: lead).
void finetune_from_config(const std::string& config, FinetuneConfig& fc,
                          const std::function<bool(const std::string&)>& given, bool lead);

// The config's scheduler (trainer.scheduler, use_scheduler) with its base lr, stepped as CREDIT's
// gen2 trainer steps it: per-batch kinds count batches (`accum` per optimizer step), per-epoch
// kinds epochs of `epoch_batches` batches. Constant without use_scheduler.
Schedule credit_schedule(const CreditConfig& c, int64_t accum, int64_t epoch_batches);

// CREDIT's validation loss: loss.validation_loss where given; with latitude or variable weights
// and none given, L1 (VariableTotalLoss2D's default); else the training loss. KCRPS with weights
// validates with KCRPS whatever validation_loss says (VariableTotalLoss2D's rule for ensembles).
LossSpec credit_validation_spec(const CreditConfig& c);
// The same as an elementwise loss (train/loss.h; fails for a CRPS loss).
LossFunction credit_validation_loss(const CreditConfig& c);

}  // namespace wxe

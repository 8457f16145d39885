// A CREDIT config (data/credit_config.h) into a fine-tuning run: `wxe finetune CONFIG.yml`.
#pragma once
#include <functional>
#include <string>

#include "train/trainer.h"

namespace wxe {

// `wxe finetune CONFIG.yml`: the config's data (samples over start_datetime..end_datetime),
// save_loc, forecast_len, trainer and loss keys into fc, except the values whose command-line
// flag was given (given("--lr") true: the flag overrides). Prints the config's warnings;
// writes channel_schema.yaml into the save folder (rank 0: lead).
void finetune_from_config(const std::string& config, FinetuneConfig& fc,
                          const std::function<bool(const std::string&)>& given, bool lead);

}  // namespace wxe

#pragma once
// The subcommands of `dsv41`, one file each; main.cpp only wires them up.
#include <CLI/CLI.hpp>

namespace dsv41::cli {

void add_inspect(CLI::App& app);
void add_init_random(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_generate(CLI::App& app);
void add_chat(CLI::App& app);
void add_bench(CLI::App& app);
void add_bench_serve(CLI::App& bench);  // under add_bench's "bench"
void add_bench_spec(CLI::App& bench);   // under add_bench's "bench"
void add_bench_vision(CLI::App& bench); // under add_bench's "bench"
void add_serve(CLI::App& app);
void add_data(CLI::App& app);
void add_train(CLI::App& app);
void add_eval(CLI::App& app);

}  // namespace dsv41::cli

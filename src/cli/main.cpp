// dsv41: the command-line front end. Every subcommand reports bad input as one line naming what
// was expected and what was found, and exits non-zero.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <exception>

#include "base/error.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"dsv41: an inference engine for DeepSeek-V4.1-Flash"};
  app.require_subcommand(1);
  // Every option's --help line shows its default (subcommands take these option defaults).
  app.option_defaults()->always_capture_default();
  dsv41::cli::add_inspect(app);
  dsv41::cli::add_init_random(app);
  dsv41::cli::add_tokenize(app);
  dsv41::cli::add_generate(app);
  dsv41::cli::add_chat(app);
  dsv41::cli::add_bench(app);
  dsv41::cli::add_serve(app);
  dsv41::cli::add_data(app);
  dsv41::cli::add_train(app);
  dsv41::cli::add_eval(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsv41: error: {}\n", e.what());
    return 1;
  }
  return 0;
}

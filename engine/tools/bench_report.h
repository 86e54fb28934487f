#pragma once
// colibri-bench's reports of a run: the text for the terminal and the one-line JSON object
// that scripts read.

#include "tools/bench_run.h"

#include <string>

namespace colibri {

/// The JSON object of a run, on one line (no newline).
std::string json_line(const cpu_bench& b);
std::string json_line(const device_bench& b);

/// The text report on stdout.
void print_text(const cpu_bench& b);
void print_text(const device_bench& b);

/// Appends `line` to json_file when set, and prints it on stdout when asked; each with a
/// newline. Throws colibri::error (io) when the file cannot be opened.
void emit_json(const std::string& line, const std::string& json_file, bool to_stdout);

} // namespace colibri

#pragma once
// The `colibri tokenize` subcommand.

namespace colibri {

/// argv[0] is "tokenize"; returns the exit status.
int tokenize_main(int argc, char** argv);

} // namespace colibri

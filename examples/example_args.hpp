// example_args.hpp — the examples' command line: --help, flags, options with a checked value,
// operands. Shared by examples/*.cpp; not part of the library.
//
//     example::command_line cli("exit_latency", "the exit-path latency of the model kernel");
//     int reps = 3;
//     bool small = false;
//     cli.option("--reps", "N", reps, example::at_least(1), "repetitions per row");
//     cli.flag("--small", small, "64 MiB, one repetition");
//     cli.parse(argc, argv);  // returns only if the command line is good
//
// --help prints the usage, every option with its default and its range, on stdout and exits 0.
// A refusal — an unknown option, an operand where none is taken, a missing value, a value that
// is not a number or is out of range, a flag given a value — prints one line naming the
// argument on stderr and exits 2, before the program has done anything. Options take their value
// as `--reps 5` or `--reps=5`; `--` ends the options. refuse() is for what only the program can
// check (two options that exclude each other), with the same message and status.
#pragma once

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace example {

/// The values an option accepts: min and max inclusive, or above min (min itself refused).
template <class Number>
struct range {
  Number min = std::numeric_limits<Number>::lowest();
  Number max = std::numeric_limits<Number>::max();
  bool min_excluded = false;
};
template <class Number>
range<Number> at_least(Number min) {
  return {.min = min};
}
template <class Number>
range<Number> above(Number min) {
  return {.min = min, .min_excluded = true};
}
template <class Number>
range<Number> between(Number min, Number max) {
  return {.min = min, .max = max};
}

class command_line {
 public:
  /// program: the name in messages and in the usage line; summary: what the program does, for
  /// --help (may hold several lines).
  command_line(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  /// A switch: present sets target to true. It takes no value.
  void flag(std::string name, bool& target, std::string help) {
    options_.push_back({std::move(name), "", std::move(help), [&target](std::string_view) {
                          target = true;
                          return std::string();
                        }});
  }

  /// An option with a number (integer or floating point), checked against `accepted`. The
  /// target's value at this call is the default that --help shows.
  template <class Number>
  void option(std::string name, std::string value_name, Number& target, range<Number> accepted, std::string help) {
    help += " (default " + shown(target) + "; " + described(accepted) + ")";
    options_.push_back({std::move(name), std::move(value_name), std::move(help),
                        [&target, accepted](std::string_view text) { return assign(text, target, accepted); }});
  }

  /// Operands (arguments that are not options), each a number checked against `accepted` and
  /// appended to target. Without this call, an operand is refused.
  template <class Number>
  void operands(std::string value_name, std::vector<Number>& target, range<Number> accepted, std::string help) {
    operand_name_ = std::move(value_name);
    operand_help_ = std::move(help) + " (each " + described(accepted) + ")";
    take_operand_ = [&target, accepted](std::string_view text) {
      Number value{};
      std::string refusal = assign(text, value, accepted);
      if (refusal.empty()) target.push_back(value);
      return refusal;
    };
  }

  /// Reads the command line; returns only if every argument was good.
  void parse(int argc, char** argv) {
    bool options_ended = false;
    for (int i = 1; i < argc; ++i) {
      const std::string_view argument = argv[i];
      if (options_ended || argument.size() < 2 || argument[0] != '-' || looks_like_number(argument)) {
        if (!take_operand_) refuse("unexpected argument '" + std::string(argument) + "'");
        if (std::string refusal = take_operand_(argument); !refusal.empty()) refuse(operand_name_ + ": " + refusal);
        continue;
      }
      if (argument == "--") {
        options_ended = true;
        continue;
      }
      if (argument == "--help" || argument == "-h") {
        print_help();
        std::exit(0);
      }
      const std::size_t equals = argument.find('=');
      const std::string_view name = argument.substr(0, equals);
      const entry* found = nullptr;
      for (const entry& e : options_) {
        if (e.name == name) found = &e;
      }
      if (found == nullptr) refuse("unknown option '" + std::string(name) + "'");
      std::string_view value;
      if (found->value_name.empty()) {
        if (equals != std::string_view::npos) refuse(found->name + " takes no value");
      } else if (equals != std::string_view::npos) {
        value = argument.substr(equals + 1);
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        refuse(found->name + " needs a value " + found->value_name);
      }
      if (std::string refusal = found->set(value); !refusal.empty()) refuse(found->name + ": " + refusal);
      given_.insert(found->name);
    }
  }

  /// True if the option was on the command line (after parse).
  bool given(const std::string& name) const { return given_.count(name) != 0; }

  /// Refuses the command line: the message on stderr, exit status 2.
  [[noreturn]] void refuse(const std::string& message) const {
    std::fprintf(stderr, "%s: %s; %s --help lists the options\n", program_.c_str(), message.c_str(),
                 program_.c_str());
    std::exit(2);
  }

 private:
  struct entry {
    std::string name;
    std::string value_name;  // empty: a flag
    std::string help;
    std::function<std::string(std::string_view)> set;  // returns why the value is refused, or ""
  };

  static bool looks_like_number(std::string_view text) {
    return text.size() >= 2 && text[0] == '-' && ((text[1] >= '0' && text[1] <= '9') || text[1] == '.');
  }

  template <class Number>
  static std::string shown(Number value) {
    if constexpr (std::is_floating_point_v<Number>) {
      char text[32];
      std::snprintf(text, sizeof text, "%.10g", static_cast<double>(value));
      return text;
    } else {
      return std::to_string(value);
    }
  }

  template <class Number>
  static std::string described(const range<Number>& accepted) {
    const bool bounded_below = accepted.min != std::numeric_limits<Number>::lowest();
    const bool bounded_above = accepted.max != std::numeric_limits<Number>::max();
    if (bounded_below && bounded_above) return "from " + shown(accepted.min) + " to " + shown(accepted.max);
    if (bounded_below) return (accepted.min_excluded ? "above " : "at least ") + shown(accepted.min);
    if (bounded_above) return "at most " + shown(accepted.max);
    return "any number";
  }

  // Parses the whole of text into value; returns why it is refused, or "".
  template <class Number>
  static std::string assign(std::string_view text, Number& value, const range<Number>& accepted) {
    const std::string quoted = "'" + std::string(text) + "'";
    Number parsed{};
    if constexpr (std::is_floating_point_v<Number>) {
      // strtod, not from_chars: libc++ 14 has no floating-point from_chars. It skips leading
      // blanks and reads "inf" and "nan", which are refused here.
      const std::string copy(text);
      char* end = nullptr;
      const double read =
          copy.empty() || std::isspace(static_cast<unsigned char>(copy[0])) ? 0 : std::strtod(copy.c_str(), &end);
      if (end == nullptr || end == copy.c_str() || *end != '\0' || !std::isfinite(read)) {
        return quoted + " is not a number";
      }
      parsed = static_cast<Number>(read);
    } else {
      const char* const first = text.data();
      const char* const last = text.data() + text.size();
      const auto [end, error] = std::from_chars(first, last, parsed);
      if (error == std::errc::result_out_of_range) return quoted + " is out of range (" + described(accepted) + ")";
      if (error != std::errc() || end != last) return quoted + " is not an integer";
    }
    const bool too_low = accepted.min_excluded ? !(parsed > accepted.min) : parsed < accepted.min;
    if (too_low || parsed > accepted.max) return quoted + " is out of range (" + described(accepted) + ")";
    value = parsed;
    return "";
  }

  void print_help() const {
    std::printf("usage: %s [OPTION...]%s\n%s\n\noptions:\n", program_.c_str(),
                operand_name_.empty() ? "" : (" [" + operand_name_ + "...]").c_str(), summary_.c_str());
    // The help wrapped at 100 columns, under itself.
    const auto line = [](const std::string& left, const std::string& help) {
      constexpr std::size_t indent = 25, width = 100;
      std::printf("  %-22s", left.c_str());
      std::size_t column = indent;
      std::size_t at = 0;
      while (at < help.size()) {
        const std::size_t space = help.find(' ', at);
        const std::string word = help.substr(at, space == std::string::npos ? std::string::npos : space - at);
        if (column > indent && column + 1 + word.size() > width) {
          std::printf("\n%*s", static_cast<int>(indent), "");
          column = indent;
        } else {
          std::printf(" ");
          ++column;
        }
        std::printf("%s", word.c_str());
        column += word.size();
        at = space == std::string::npos ? help.size() : space + 1;
      }
      std::printf("\n");
    };
    if (!operand_name_.empty()) line(operand_name_ + "...", operand_help_);
    for (const entry& e : options_) line(e.value_name.empty() ? e.name : e.name + " " + e.value_name, e.help);
    line("--help", "print this and exit");
  }

  std::string program_;
  std::string summary_;
  std::vector<entry> options_;
  std::string operand_name_;
  std::string operand_help_;
  std::function<std::string(std::string_view)> take_operand_;
  std::set<std::string> given_;
};

}  // namespace example

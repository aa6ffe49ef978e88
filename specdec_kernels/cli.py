"""The `specdec-kernels` command:

  info      what was built, which backends `auto` picks here (--json: the full record)
  demo      every strategy on one model pair, checked against greedy and timed (specdec_kernels/demo.py)
  generate  your prompts with one strategy: text and statistics (specdec_kernels/generate_command.py)
  bench     a benchmark script of a source checkout (specdec_kernels/bench_command.py)
  selftest  every GPU kernel vs the torch reference on this GPU, and the engine vs greedy (specdec_kernels/selftest/)
"""

import argparse
import sys

from ._version import __version__


def main(argv: list[str] | None = None) -> int:
    from . import bench_command, demo, generate_command, info_command, selftest

    parser = argparse.ArgumentParser(prog="specdec-kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {"info": (info_command, "print what was built and which backends `auto` picks on this machine"),
                "demo": (demo, "decode with every strategy, check against greedy, print a table"),
                "generate": (generate_command, "decode prompts with one strategy, print text and statistics"),
                "bench": (bench_command, "run a benchmark script of a source checkout"),
                "selftest": (selftest, "check every GPU kernel against the torch reference on this GPU "
                                       "(the first thing to run after pip install)")}
    for name, (module, summary) in commands.items():
        module.add_arguments(sub.add_parser(name, help=summary, description=module.__doc__,
                                            formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    return commands[args.command][0].run(args)


if __name__ == "__main__":
    sys.exit(main())

"""The `specdec-kernels` command. `specdec-kernels info` prints build_info() as JSON; `specdec-kernels demo`
runs every strategy on the embedded default models (see specdec_kernels/demo.py)."""

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec-kernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print what was built and which backends `auto` picks on this machine")
    from . import demo

    demo.add_arguments(sub.add_parser("demo", help="decode with every strategy, check against greedy, print a table",
                                      description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run(args)
    if args.command == "info":
        from . import build_info

        json.dump(build_info(), sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

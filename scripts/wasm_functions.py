#!/usr/bin/env python3
"""The largest function bodies of a Wasm module, refused over a ceiling.

V8 compiles every function of the module with TurboFan when a VM loads, and
Envoy's allocator keeps what compiling took for the proxy's life: what a
function costs grows faster than the function (docs/bench.md, "What a
function costs"). `make build` refuses a module with a function body over
the ceiling, so an inlining that builds one back is seen at once.

    wasm_functions.py MODULE [CEILING] [--top N]
"""
import sys


def leb(data, i):
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def bodies(data):
    """The size of every function body, in the code section's order."""
    if data[:4] != b"\0asm":
        raise ValueError("not a Wasm module")
    i = 8
    while i < len(data):
        section = data[i]
        size, i = leb(data, i + 1)
        if section == 10:
            count, j = leb(data, i)
            sizes = []
            for _ in range(count):
                n, j = leb(data, j)
                sizes.append(n)
                j += n
            return sizes
        i += size
    return []


def main(argv):
    top = 1
    if "--top" in argv:
        k = argv.index("--top")
        top = int(argv[k + 1])
        del argv[k : k + 2]
    module = argv[1]
    ceiling = int(argv[2]) if len(argv) > 2 else None
    with open(module, "rb") as f:
        sizes = sorted(bodies(f.read()), reverse=True)
    print(f"{module}: {len(sizes)} functions, the largest {sizes[:top]} bytes")
    if ceiling is not None and sizes and sizes[0] > ceiling:
        print(f"{module}: a function of {sizes[0]} bytes, over the {ceiling}-byte ceiling")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

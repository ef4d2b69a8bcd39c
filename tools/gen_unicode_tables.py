#!/usr/bin/env python3
"""Generate libh3/unicode_tables.c: the Unicode data the tokenizer needs.

The tokenizer must give the same ids as HF `tokenizers` (0.23.3), so the tables follow the
Unicode versions *that library* uses, not the newest ones:

  * Character classes for the Qwen2 split pattern (\\p{L}, \\p{N}, \\p{M}, \\s): HF compiles the
    pattern with Oniguruma (onig_sys), whose tables are Unicode 16.0.0. Probing tokenizers
    0.23.3 shows 16.0 letters (U+1C89, U+105C0...) matched by \\p{L} and 17.0 ones (U+10940)
    not. So classes come from a Unicode 16.0.0 `unicodedata`: the stdlib module on Python
    3.14, or the `unicodedata2==16.0.0` backport elsewhere (Python 3.11 ships 14.0.0).
    \\s is White_Space = Zs + Zl + Zp + U+0009..U+000D + U+0085 (unicodedata has no
    White_Space property; the generator checks the derived set against the known list).

  * NFC: HF's NFC normalizer (crate unicode-normalization-alignments) carries Unicode 9.0
    tables: marks added in 10.0 or later (U+0D3B, U+1ABF...) keep combining class 0 there and
    U+11938 (13.0) is never composed. So decompositions, combining classes and compositions
    are taken from the 16.0 data but kept only for characters assigned in Unicode <= 9.0.
    Normalization data of assigned characters never changes (Unicode stability policy), so
    this is exactly the 9.0 data. Python's unicodedata has no Age property, so "assigned in
    <= 9.0" comes from Perl's Unicode::UCD (prop_invlist("In=9.0")), present wherever Perl is.

  * \\w for added tokens with single_word=true (HF uses the Rust regex crate's \\w, i.e.
    Alphabetic + M + Nd + Pc + Join_Control). Alphabetic is approximated as L + Nl + the
    Perl Alphabetic set (Perl's UCD version; Other_Alphabetic symbols added after it are
    missed). Only single_word tokens are affected; the Qwen files have none.

Usage:  python3 tools/gen_unicode_tables.py [output.c]     (default libh3/unicode_tables.c)
Needs a Unicode 16.0.0 unicodedata (see above) and perl.
"""
import subprocess
import sys

CLASS_UNICODE = "16.0.0"
NFC_AGE = "9.0"

# Bits of the class table; keep in sync with libh3/tokenizer.h.
C_L, C_N, C_M, C_WS, C_WORD, C_NFC = 1, 2, 4, 8, 16, 32

WHITE_SPACE_16 = [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B)) + [
    0x2028, 0x2029, 0x202F, 0x205F, 0x3000]

HANGUL_S0, HANGUL_SN = 0xAC00, 11172


def load_ucd():
    import unicodedata
    if unicodedata.unidata_version == CLASS_UNICODE:
        return unicodedata
    try:
        import unicodedata2
    except ImportError:
        sys.exit("need Unicode %s: run on Python 3.14, or pip install unicodedata2==%s (stdlib has %s)"
                 % (CLASS_UNICODE, CLASS_UNICODE, unicodedata.unidata_version))
    if unicodedata2.unidata_version != CLASS_UNICODE:
        sys.exit("unicodedata2 is %s, need %s" % (unicodedata2.unidata_version, CLASS_UNICODE))
    return unicodedata2


def perl_invlist(prop):
    out = subprocess.run(["perl", "-MUnicode::UCD=prop_invlist", "-e",
                          'print join(",", prop_invlist("%s")), "\\n"' % prop],
                         check=True, capture_output=True, text=True).stdout.strip()
    inv = [int(x) for x in out.split(",") if x]
    if not inv:
        sys.exit("perl returned no data for %s" % prop)
    inv.append(0x110000)
    s = set()
    for i in range(0, len(inv) - 1, 2):
        s.update(range(inv[i], inv[i + 1]))
    return s


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "libh3/unicode_tables.c"
    ud = load_ucd()
    old = perl_invlist("In=%s" % NFC_AGE)
    alpha = perl_invlist("Alphabetic")
    perl_ver = subprocess.run(["perl", "-MUnicode::UCD", "-e", "print Unicode::UCD::UnicodeVersion()"],
                              check=True, capture_output=True, text=True).stdout.strip()
    assert 0x0D3B not in old and 0x08D4 in old, "Perl's In=%s looks wrong" % NFC_AGE

    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]

    # ---- canonical decomposition / combining class / composition at Unicode 9.0 ----
    ccc = {}
    decomp = {}
    for c in cps:
        if c not in old or HANGUL_S0 <= c < HANGUL_S0 + HANGUL_SN:
            continue
        ch = chr(c)
        k = ud.combining(ch)
        if k:
            ccc[c] = k
        d = ud.decomposition(ch)
        if d and not d.startswith("<"):
            full = [ord(x) for x in ud.normalize("NFD", ch)]
            assert all(x in old for x in full)
            decomp[c] = full
    comp = {}
    for c, _ in decomp.items():
        d = ud.decomposition(chr(c)).split()
        if len(d) == 2 and ud.normalize("NFC", chr(c)) == chr(c):
            a, b = int(d[0], 16), int(d[1], 16)
            comp[(a, b)] = c
    seconds = {b for (_, b) in comp}
    composites = set(comp.values())

    # ---- class table ----
    ws = {c for c in cps if ud.category(chr(c)) in ("Zs", "Zl", "Zp")} | {0x9, 0xA, 0xB, 0xC, 0xD, 0x85}
    assert sorted(ws) == WHITE_SPACE_16, "White_Space derivation changed"
    cls = bytearray(0x110000)
    for c in cps:
        cat = ud.category(chr(c))
        v = 0
        if cat[0] == "L":
            v |= C_L
        elif cat[0] == "N":
            v |= C_N
        elif cat[0] == "M":
            v |= C_M
        if c in ws:
            v |= C_WS
        if cat[0] == "L" or cat == "Nl" or cat[0] == "M" or cat in ("Nd", "Pc") or c in alpha \
                or c in (0x200C, 0x200D):
            v |= C_WORD
        # NFC quick check is not "yes", or the char reorders: a piece without such chars is
        # already NFC and skips normalization.
        if c in ccc or c in seconds or (c in decomp and c not in composites) \
                or 0x1161 <= c <= 0x1175 or 0x11A8 <= c <= 0x11C2:
            v |= C_NFC
        cls[c] = v
    class_ranges = []
    prev = -1
    for c in range(0x110000):
        if cls[c] != prev:
            class_ranges.append((c << 8) | cls[c])
            prev = cls[c]

    ccc_ranges = []
    prev = -1
    for c in range(0x110000):
        k = ccc.get(c, 0)
        if k != prev:
            ccc_ranges.append((c << 8) | k)
            prev = k

    dec_keys = sorted(decomp)
    pool = []
    dec_info = []
    for c in dec_keys:
        d = decomp[c]
        assert len(d) <= 4  # DECOMP_MAX in tokenizer.c
        dec_info.append((len(pool) << 3) | len(d))
        pool.extend(d)
    comp_items = sorted(((a << 21) | b, c) for (a, b), c in comp.items())

    def emit(f, ctype, name, vals, per_line, fmt):
        f.write("const %s %s[%d] = {\n" % (ctype, name, len(vals)))
        for i in range(0, len(vals), per_line):
            f.write("    " + ", ".join(fmt % v for v in vals[i:i + per_line]) + ",\n")
        f.write("};\n")

    with open(out_path, "w") as f:
        f.write("/*\n * GENERATED by tools/gen_unicode_tables.py -- do not edit by hand.\n")
        f.write(" *\n * Character classes: Unicode %s (unicodedata %s), the version of the Oniguruma\n"
                " * tables HF tokenizers 0.23.3 matches \\p{L} \\p{N} \\p{M} \\s with.\n" % (CLASS_UNICODE, ud.unidata_version))
        f.write(" * NFC data: characters assigned in Unicode <= %s only (HF's normalizer tables);\n"
                " * \"assigned\" from Perl Unicode::UCD %s. See the generator for the reasons.\n */\n"
                % (NFC_AGE, perl_ver))
        f.write('#include "tokenizer.h"\n\n')
        f.write("/* Sorted (first code point << 8 | class bits); each entry holds until the next. */\n")
        emit(f, "uint32_t", "h3u_class_ranges", class_ranges, 8, "0x%08x")
        f.write("const size_t h3u_class_ranges_n = %d;\n\n" % len(class_ranges))
        f.write("/* Sorted (first code point << 8 | canonical combining class), same layout. */\n")
        emit(f, "uint32_t", "h3u_ccc_ranges", ccc_ranges, 8, "0x%08x")
        f.write("const size_t h3u_ccc_ranges_n = %d;\n\n" % len(ccc_ranges))
        f.write("/* Code points with a canonical decomposition (Hangul excluded: algorithmic), sorted;\n"
                " * info = offset into h3u_decomp_pool << 3 | length of the full decomposition. */\n")
        emit(f, "uint32_t", "h3u_decomp_cp", dec_keys, 8, "0x%05x")
        emit(f, "uint32_t", "h3u_decomp_info", dec_info, 8, "0x%05x")
        emit(f, "uint32_t", "h3u_decomp_pool", pool, 8, "0x%05x")
        f.write("const size_t h3u_decomp_n = %d;\n\n" % len(dec_keys))
        f.write("/* Primary composites: key = first << 21 | second, sorted; value = composite. */\n")
        emit(f, "uint64_t", "h3u_comp_key", [k for k, _ in comp_items], 4, "0x%011xull")
        emit(f, "uint32_t", "h3u_comp_val", [v for _, v in comp_items], 8, "0x%05x")
        f.write("const size_t h3u_comp_n = %d;\n" % len(comp_items))
    print("%s: %d class ranges, %d ccc ranges, %d decompositions (%d pool), %d compositions"
          % (out_path, len(class_ranges), len(ccc_ranges), len(dec_keys), len(pool), len(comp_items)))


if __name__ == "__main__":
    main()

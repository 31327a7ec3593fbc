package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// runCatalogLookup asks the peer how much of a chain it holds: "would this
// prompt hit?". The chain is given as page keys, or as a prompt's token ids
// and the engine's layout, from which the keys are computed exactly as the
// engine adapters compute them (internal/pagekey, orbitkv/keys.py).
func runCatalogLookup(ctx context.Context, args []string, out io.Writer) error {
	var d dialFlags
	fs := flag.NewFlagSet("catalog lookup", flag.ContinueOnError)
	d.register(fs)
	layoutArg := fs.String("layout", "", "the engine's layout: JSON ({\"model\":…,\"page_tokens\":64,…}, the fields of orbitkv.keys.Layout) or a file holding it")
	tokensArg := fs.String("tokens", "", "the prompt's token ids, comma- or space-separated (needs --layout)")
	tokensFile := fs.String("tokens-file", "", "a file of token ids: a JSON array or ids separated by commas or spaces; - reads stdin (needs --layout)")
	keysOnly := fs.Bool("keys-only", false, "print the page keys of --tokens and --layout, one per line, without asking the peer")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: orbitkv catalog lookup [flags] KEY...\n       orbitkv catalog lookup [flags] --layout JSON|FILE --tokens IDS|--tokens-file FILE")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	keys, err := lookupKeys(fs.Args(), *layoutArg, *tokensArg, *tokensFile, out, *keysOnly)
	if err != nil || *keysOnly {
		return err
	}
	c, cctx, done, err := d.admin(ctx)
	if err != nil {
		return err
	}
	defer done()
	res, err := c.CatalogLookup(cctx, &pb.CatalogLookupRequest{Keys: keys})
	if err != nil {
		return fmt.Errorf("lookup: %w", err)
	}
	fmt.Fprintf(out, "hit %d of %d pages\n", res.HitPages, len(keys))
	for i, t := range res.Tiers {
		fmt.Fprintf(out, "%4d %x %s\n", i, keys[i], tierName(t))
	}
	return nil
}

// lookupKeys is the chain to look up: the keys given, or those of the
// tokens under the layout (with keysOnly, printed instead).
func lookupKeys(hexKeys []string, layoutArg, tokensArg, tokensFile string, out io.Writer, keysOnly bool) ([][]byte, error) {
	if layoutArg == "" {
		if tokensArg != "" || tokensFile != "" || keysOnly {
			return nil, fmt.Errorf("--tokens, --tokens-file and --keys-only need --layout")
		}
		return parseHexKeys(hexKeys)
	}
	if len(hexKeys) > 0 {
		return nil, fmt.Errorf("give page keys or --layout with tokens, not both (got %q)", hexKeys[0])
	}
	layout, err := parseLayout(layoutArg)
	if err != nil {
		return nil, err
	}
	tokens, err := readTokens(tokensArg, tokensFile)
	if err != nil {
		return nil, err
	}
	chain := pagekey.Chain(layout.Fingerprint(), int(layout.PageTokens), tokens)
	if len(chain) == 0 {
		return nil, fmt.Errorf("%d tokens make no whole page of %d tokens: nothing to look up", len(tokens), layout.PageTokens)
	}
	if keysOnly {
		for _, k := range chain {
			fmt.Fprintln(out, k)
		}
		return nil, nil
	}
	fmt.Fprintf(out, "layout %s, %d tokens: %d whole pages of %d", layout.Fingerprint(), len(tokens), len(chain), layout.PageTokens)
	if tail := len(tokens) % int(layout.PageTokens); tail > 0 {
		fmt.Fprintf(out, " (the last %d tokens make no page and are always recomputed)", tail)
	}
	fmt.Fprintln(out)
	keys := make([][]byte, len(chain))
	for i := range chain {
		keys[i] = chain[i][:]
	}
	return keys, nil
}

func parseHexKeys(args []string) ([][]byte, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("catalog lookup needs page keys (32 hex digits each, in chain order) or --layout with --tokens")
	}
	keys := make([][]byte, 0, len(args))
	for _, a := range args {
		k, err := hex.DecodeString(a)
		if err != nil || len(k) != pagekey.Size {
			return nil, fmt.Errorf("key %q: want 32 hex digits", a)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// parseLayout reads the layout from inline JSON or a file; every field is
// required (a missing one would silently change the fingerprint).
func parseLayout(arg string) (pagekey.Layout, error) {
	b := []byte(arg)
	if !strings.HasPrefix(strings.TrimSpace(arg), "{") {
		var err error
		if b, err = os.ReadFile(arg); err != nil {
			return pagekey.Layout{}, fmt.Errorf("--layout: %w", err)
		}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return pagekey.Layout{}, fmt.Errorf("--layout: %w", err)
	}
	for _, name := range []string{"model", "revision", "dtype", "num_layers", "kv_heads", "head_dim", "tp_rank", "tp_size", "page_tokens", "byte_layout"} {
		if _, ok := fields[name]; !ok {
			return pagekey.Layout{}, fmt.Errorf("--layout: field %q is missing (the fields of orbitkv.keys.Layout are all required)", name)
		}
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var l pagekey.Layout
	if err := dec.Decode(&l); err != nil {
		return pagekey.Layout{}, fmt.Errorf("--layout: %w", err)
	}
	if l.PageTokens == 0 {
		return pagekey.Layout{}, fmt.Errorf("--layout: page_tokens must be positive")
	}
	return l, nil
}

// readTokens parses token ids from the flag or the file.
func readTokens(arg, file string) ([]uint32, error) {
	text := arg
	switch {
	case arg != "" && file != "":
		return nil, fmt.Errorf("give --tokens or --tokens-file, not both")
	case file == "-":
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("--tokens-file -: %w", err)
		}
		text = string(b)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--tokens-file: %w", err)
		}
		text = string(b)
	}
	fields := strings.FieldsFunc(text, func(r rune) bool {
		return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' || r == '[' || r == ']'
	})
	if len(fields) == 0 {
		return nil, fmt.Errorf("no token ids: give --tokens or --tokens-file")
	}
	tokens := make([]uint32, len(fields))
	for i, f := range fields {
		v, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token %d %q: want an unsigned 32-bit id", i, f)
		}
		tokens[i] = uint32(v)
	}
	return tokens, nil
}

package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/orbitkv/orbitkv/fabric"
)

// serveSettings is `orbitkv serve`'s configuration with where each value
// came from: the config file (docs/configuration.md, "Config file"), whose
// keys are the flags' names, and the command line, which overrides it.
type serveSettings struct {
	cfg      fabric.Config
	logLevel string
	file     string            // --config; "" for none
	fs       *flag.FlagSet     // bound to cfg, logLevel and file
	from     map[string]string // flag name -> "flag" or "FILE:LINE"; absent: default
}

// newServeFlags registers every flag of `orbitkv serve` on a fresh set.
func newServeFlags(s *serveSettings, name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	s.cfg.RegisterFlags(fs)
	fs.StringVar(&s.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&s.file, "config", "", "YAML config file; its keys are these flags' names, and flags given here override it")
	return fs
}

// loadServeSettings parses args (flags only) over the config file they name,
// over the defaults; it does not validate the result.
func loadServeSettings(name string, args []string) (*serveSettings, error) {
	s := &serveSettings{cfg: fabric.DefaultConfig(), from: map[string]string{}}
	s.fs = newServeFlags(s, name)
	if err := s.fs.Parse(args); err != nil {
		return nil, err
	}
	if s.fs.NArg() > 0 {
		return nil, fmt.Errorf("%s takes flags only, got the argument %q (flags are --name value; a config file is --config FILE)", name, s.fs.Arg(0))
	}
	s.fs.Visit(func(f *flag.Flag) { s.from[f.Name] = "flag" })
	if s.file != "" {
		if err := s.applyFile(s.file); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// applyFile sets every key of the YAML file that the command line did not.
func (s *serveSettings) applyFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // empty file: the defaults
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return fmt.Errorf("config file %s:%d: want a mapping of keys (the serve flags' names) to values", path, m.Line)
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if err := s.applyKey(path, k, v); err != nil {
			return err
		}
	}
	return nil
}

func (s *serveSettings) applyKey(path string, k, v *yaml.Node) error {
	at := fmt.Sprintf("%s:%d", path, k.Line)
	f := s.fs.Lookup(k.Value)
	switch {
	case f == nil:
		return fmt.Errorf("config file %s: unknown key %q (keys are the serve flags' names: docs/configuration.md)", at, k.Value)
	case k.Value == "config":
		return fmt.Errorf("config file %s: key \"config\" is for the command line only", at)
	case v.Kind != yaml.ScalarNode:
		return fmt.Errorf("config file %s: key %q wants a single value", at, k.Value)
	}
	if prev, ok := s.from[k.Value]; ok && prev != "flag" {
		return fmt.Errorf("config file %s: key %q repeats the one at %s", at, k.Value, prev)
	}
	if _, ok := s.from[k.Value]; ok {
		return nil // the command line overrides the file
	}
	if err := s.fs.Set(k.Value, v.Value); err != nil {
		return fmt.Errorf("config file %s: key %q: %v", at, k.Value, err)
	}
	s.from[k.Value] = at
	return nil
}

// source says where a flag's effective value came from. Values the
// validation filled in (the socket from the data dir, the cluster's
// addresses from the gossip address) are "derived".
func (s *serveSettings) source(f *flag.Flag) string {
	if from, ok := s.from[f.Name]; ok {
		if from == "flag" {
			return "flag"
		}
		return "file " + from
	}
	if f.Value.String() != f.DefValue {
		return "derived"
	}
	return "default"
}

// effective lists every setting as "key: value" in flag order; with
// sources, each line ends in "# where from". The output is itself a valid
// config file.
func (s *serveSettings) effective(sources bool) string {
	var b bytes.Buffer
	s.fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config" {
			return
		}
		fmt.Fprintf(&b, "%s: %s", f.Name, yamlScalar(f.Value.String()))
		if sources {
			fmt.Fprintf(&b, "  # %s", s.source(f))
		}
		b.WriteByte('\n')
	})
	return b.String()
}

// fields returns the settings as flag name -> value, for the start log.
func (s *serveSettings) fields() map[string]any {
	out := map[string]any{}
	s.fs.VisitAll(func(f *flag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

var plainScalar = regexp.MustCompile(`^[A-Za-z0-9_./,@+-][A-Za-z0-9_./:,@+-]*$`)

// yamlScalar writes v so that YAML reads it back as the same string.
func yamlScalar(v string) string {
	if plainScalar.MatchString(v) {
		return v
	}
	return strconv.Quote(v)
}

func runConfig(ctx context.Context, args []string, out io.Writer) error {
	return subcommand(ctx, "config", args, out, map[string]func(context.Context, []string, io.Writer) error{
		"print": runConfigPrint,
	})
}

// runConfigPrint prints the configuration `orbitkv serve` would run with
// the same flags: every key, its value after validation, and its source.
func runConfigPrint(_ context.Context, args []string, out io.Writer) error {
	s, err := loadServeSettings("config print", args)
	if err != nil {
		return err
	}
	verr := s.cfg.Validate()
	fmt.Fprintf(out, "# orbitkv serve's effective configuration (key: value  # from the default, a flag, the --config file, or derived)\n%s", s.effective(true))
	if verr != nil {
		return fmt.Errorf("the configuration is refused: %w", verr)
	}
	return nil
}

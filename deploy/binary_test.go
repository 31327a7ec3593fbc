package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// binPath is the orbitkv binary under test: ORBITKV_BIN, or one built from
// the repository for this test run.
var binPath string

func TestMain(m *testing.M) {
	code, err := buildAndRun(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func buildAndRun(m *testing.M) (int, error) {
	if p := os.Getenv("ORBITKV_BIN"); p != "" {
		binPath = p
		return m.Run(), nil
	}
	dir, err := os.MkdirTemp("", "orbitkv-deploy-bin")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "orbitkv")
	cmd := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", binPath, "./cmd/orbitkv")
	cmd.Dir, cmd.Stderr = "..", os.Stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("build orbitkv: %w", err)
	}
	return m.Run(), nil
}

// flagSet is the flags one orbitkv command accepts: name -> kind, as its
// --help prints them ("" for a boolean flag, else "string", "int",
// "duration" or "value", the byte sizes).
type flagSet map[string]string

var helpLine = regexp.MustCompile(`^  --?([a-z0-9][a-z0-9-]*)(?: ([a-z]+))?\b`)

// commandFlags runs `orbitkv CMD... --help` and reads its flags.
func commandFlags(t *testing.T, cmd ...string) flagSet {
	t.Helper()
	out, _ := exec.Command(binPath, append(cmd, "--help")...).CombinedOutput() // --help exits 2 (flag.ErrHelp)
	fs := parseHelp(string(out))
	if len(fs) == 0 {
		t.Fatalf("orbitkv %s --help printed no flags:\n%s", strings.Join(cmd, " "), out)
	}
	return fs
}

func parseHelp(help string) flagSet {
	fs := flagSet{}
	for _, line := range strings.Split(help, "\n") {
		if m := helpLine.FindStringSubmatch(line); m != nil {
			fs[m[1]] = m[2]
		}
	}
	return fs
}

var sizeRe = regexp.MustCompile(`^[0-9]+ ?(TiB|GiB|MiB|KiB|TB|GB|MB|KB|B)?$`)

// check reports the first argument in args that the command would refuse:
// an unknown flag, a flag without its value, a value not of the flag's
// type, or a stray positional argument.
func (fs flagSet) check(args []string) error {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			return fmt.Errorf("stray argument %q", a)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		kind, ok := fs[name]
		if !ok {
			return fmt.Errorf("%s: the binary has no flag --%s", a, name)
		}
		if kind == "" { // boolean: --x or --x=BOOL
			if _, err := strconv.ParseBool(value); hasValue && err != nil {
				return fmt.Errorf("%s: not a boolean", a)
			}
			continue
		}
		if !hasValue {
			if i+1 == len(args) {
				return fmt.Errorf("%s: no value", a)
			}
			i++
			value = args[i]
		}
		if err := checkKind(kind, value); err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
	}
	return nil
}

func checkKind(kind, v string) error {
	var err error
	switch kind {
	case "int":
		_, err = strconv.Atoi(v)
	case "duration":
		_, err = time.ParseDuration(v)
	case "value": // the byte sizes (internal/bytesize)
		if !sizeRe.MatchString(v) {
			err = fmt.Errorf("%q is not a byte size", v)
		}
	}
	return err
}

// TestFlagCheck keeps the checker honest: it reads the flag kinds from the
// real --help and refuses each kind of mistake.
func TestFlagCheck(t *testing.T) {
	fs := commandFlags(t, "serve")
	for name, kind := range map[string]string{"data-dir": "string", "dram-bytes": "value", "lease-ttl": "duration",
		"max-keys": "int", "ssd-discard": ""} {
		if fs[name] != kind {
			t.Errorf("--help parse: --%s is %q, want %q", name, fs[name], kind)
		}
	}
	for name, tc := range map[string]struct {
		args []string
		bad  bool
	}{
		"good":           {args: []string{"--data-dir=/x", "--dram-bytes", "4GiB", "--ssd-discard", "--lease-ttl=5s", "--max-keys=3"}},
		"unknown":        {args: []string{"--dram-size=1GiB"}, bad: true},
		"size":           {args: []string{"--dram-bytes=1.5GiB"}, bad: true},
		"duration":       {args: []string{"--lease-ttl=30"}, bad: true},
		"int":            {args: []string{"--max-keys=many"}, bad: true},
		"bool":           {args: []string{"--ssd-discard=maybe"}, bad: true},
		"missing value":  {args: []string{"--data-dir"}, bad: true},
		"stray argument": {args: []string{"--data-dir=/x", "extra"}, bad: true},
	} {
		t.Run(name, func(t *testing.T) {
			if err := fs.check(tc.args); (err != nil) != tc.bad {
				t.Errorf("check(%q) = %v, want error %v", tc.args, err, tc.bad)
			}
		})
	}
}

// acceptedByBinary runs `orbitkv config print ARGS`, which parses serve's
// flags and validates the configuration as `orbitkv serve` does before it
// allocates anything, and reports its refusal.
func acceptedByBinary(t *testing.T, serveArgs []string) error {
	t.Helper()
	out, err := exec.Command(binPath, append([]string{"config", "print"}, serveArgs...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("orbitkv config print %s: %v\n%s", strings.Join(serveArgs, " "), err, lastLine(out))
	}
	return nil
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const unitPath = "systemd/orbitkv.service"

// unit reads a systemd unit's [Service] directives (continuation lines
// joined), each key's values in order.
func unit(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	dirs := map[string][]string{}
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, _ := strings.Cut(line, "=")
			dirs[k] = append(dirs[k], strings.TrimSpace(v))
		}
	}
	return dirs
}

// TestSystemdUnit: the unit runs `orbitkv serve` with flags the binary
// accepts, the chart's defaults, the limits and directories the peer needs.
func TestSystemdUnit(t *testing.T) {
	dirs := unit(t, unitPath)
	if len(dirs["ExecStart"]) != 1 {
		t.Fatalf("ExecStart %q, want one", dirs["ExecStart"])
	}
	argv := strings.Fields(dirs["ExecStart"][0])
	if len(argv) < 2 || argv[0] != "/usr/local/bin/orbitkv" || argv[1] != "serve" {
		t.Fatalf("ExecStart runs %q, want /usr/local/bin/orbitkv serve", argv)
	}
	if err := commandFlags(t, "serve").check(argv[2:]); err != nil {
		t.Errorf("ExecStart: orbitkv serve: %v", err)
	}
	if err := acceptedByBinary(t, argv[2:]); err != nil {
		t.Errorf("ExecStart: %v", err)
	}
	for key, want := range map[string]string{
		"LimitMEMLOCK": "infinity", "Restart": "on-failure", "RuntimeDirectory": "orbitkv",
		"StateDirectory": "orbitkv", "AmbientCapabilities": "CAP_IPC_LOCK", "ProtectSystem": "strict",
	} {
		if got := dirs[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s=%q, want %s", key, got, want)
		}
	}
	if socket, _ := flagValue(argv, "socket"); filepath.Dir(socket) != "/run/orbitkv" {
		t.Errorf("--socket=%s, want it in RuntimeDirectory /run/orbitkv", socket)
	}
	rw := strings.Fields(strings.Join(dirs["ReadWritePaths"], " "))
	for _, flag := range []string{"data-dir", "socket"} {
		v, _ := flagValue(argv, flag)
		if flag == "socket" {
			v = filepath.Dir(v)
		}
		if !slices.Contains(rw, v) {
			t.Errorf("ReadWritePaths %q leaves --%s %s read-only under ProtectSystem=strict", rw, flag, v)
		}
	}
	checkSameDefaults(t, argv[2:])
}

// checkSameDefaults: the unit passes the chart's default flags, with the
// same values, but for the metrics listener (loopback on a bare host).
func checkSameDefaults(t *testing.T, unitArgs []string) {
	t.Helper()
	_, _, c := renderDecode(t, "")
	chart := slices.DeleteFunc(slices.Clone(c.Args[1:]), func(a string) bool { return strings.HasPrefix(a, "--metrics-addr=") })
	mine := slices.DeleteFunc(slices.Clone(unitArgs), func(a string) bool { return strings.HasPrefix(a, "--metrics-addr=") })
	slices.Sort(chart)
	slices.Sort(mine)
	if !slices.Equal(chart, mine) {
		t.Errorf("the unit's flags differ from the chart's defaults:\n unit  %q\n chart %q", mine, chart)
	}
	if v, _ := flagValue(unitArgs, "metrics-addr"); v != "127.0.0.1:9464" {
		t.Errorf("--metrics-addr=%s, want the binary's default 127.0.0.1:9464", v)
	}
}

// TestSystemdUnitVerifies runs systemd-analyze verify, which reports unknown
// or misspelt directives, on the unit (its binary path pointed at the one
// under test).
func TestSystemdUnitVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze on this machine")
	}
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "orbitkv.service")
	text := strings.ReplaceAll(string(b), "/usr/local/bin/orbitkv", binPath)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", path).CombinedOutput()
	if err != nil || strings.Contains(string(out), path) {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

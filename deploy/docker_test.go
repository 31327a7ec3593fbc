package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile: nothing here builds the image (no container engine), so
// check what the chart relies on in it: the binary's path, the link flag every
// build needs, the Go release of go.mod, and a CMD the binary accepts.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	for _, want := range []string{
		"COPY --from=build /out/orbitkv /usr/local/bin/orbitkv",
		`ENTRYPOINT ["/usr/local/bin/orbitkv"]`,
		`-ldflags="-checklinkname=0 `,
		"CGO_ENABLED=1",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	stamp := regexp.MustCompile(`BUILDINFO := (\S+)`).FindSubmatch(makefile)
	for _, v := range []string{"version", "revision"} {
		if stamp == nil || !strings.Contains(df, "-X "+string(stamp[1])+"."+v+"=") {
			t.Errorf("Dockerfile does not stamp buildinfo's %s as make build does", v)
		}
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(gomod))
	if goVersion == nil || !strings.Contains(df, "FROM golang:"+goVersion[1]+"-") {
		t.Errorf("Dockerfile's Go image is not go.mod's release %v", goVersion)
	}
	m := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindStringSubmatch(df)
	if m == nil {
		t.Fatal("no CMD")
	}
	var argv []string
	if err := json.Unmarshal([]byte(m[1]), &argv); err != nil || len(argv) == 0 || argv[0] != "serve" {
		t.Fatalf("CMD %s: want [\"serve\", flags...] (%v)", m[1], err)
	}
	if err := commandFlags(t, "serve").check(argv[1:]); err != nil {
		t.Errorf("CMD: orbitkv serve: %v", err)
	}
	if err := acceptedByBinary(t, argv[1:]); err != nil {
		t.Errorf("CMD: %v", err)
	}
}

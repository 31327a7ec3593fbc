//go:build cgo && linux

package cuda

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

const ipcExporterEnv = "ORBITKV_CUDA_IPC_EXPORTER"

// TestMain turns the test binary into the exporting process of the IPC test
// when ipcExporterEnv is set (a process cannot open its own IPC handles).
func TestMain(m *testing.M) {
	if n := os.Getenv(ipcExporterEnv); n != "" {
		size, _ := strconv.Atoi(n)
		if err := ipcExporter(size, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "exporter:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ipcExporter allocates size bytes on GPU 0, fills them, prints
// "HANDLE <hex> <offset> <size> <sha256>", then answers one
// "VERIFY <sha256>" line with "OK" or "MISMATCH <sha256>".
func ipcExporter(size int, in io.Reader, out io.Writer) error {
	d, err := Open(0)
	if err != nil {
		return err
	}
	defer d.Close()
	m, err := d.Alloc(uint64(size))
	if err != nil {
		return err
	}
	defer m.Free()
	buf := make([]byte, size)
	fillRandom(rand.New(rand.NewPCG(7, 8)), buf)
	if err := d.CopyToDevice(m.Ptr, buf); err != nil {
		return err
	}
	h, err := d.ExportIPC(m.Ptr)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(buf)
	fmt.Fprintf(out, "HANDLE %s 0 %d %x\n", hex.EncodeToString(h[:]), size, sum)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil {
		return err
	}
	if err := d.CopyFromDevice(buf, m.Ptr); err != nil {
		return err
	}
	got := fmt.Sprintf("%x", sha256.Sum256(buf))
	if strings.TrimSpace(strings.TrimPrefix(line, "VERIFY ")) == got {
		fmt.Fprintln(out, "OK")
	} else {
		fmt.Fprintln(out, "MISMATCH", got)
	}
	return nil
}

// exporter is a running exporting process and its protocol streams.
type exporter struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	handle IPCHandle
	offset uint64
	size   uint64
	sum    string
}

func startExporter(t *testing.T, cmd *exec.Cmd) *exporter {
	t.Helper()
	e := &exporter{cmd: cmd}
	var err error
	if e.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start exporter: %v", err)
	}
	t.Cleanup(func() { _ = e.in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	e.out = bufio.NewReader(stdout)
	line, err := e.out.ReadString('\n')
	if err != nil {
		t.Fatalf("read exporter handle: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != "HANDLE" {
		t.Fatalf("exporter said %q", line)
	}
	raw, err := hex.DecodeString(f[1])
	if err != nil || len(raw) != len(e.handle) {
		t.Fatalf("exporter handle %q: %d bytes, %v", f[1], len(raw), err)
	}
	copy(e.handle[:], raw)
	e.offset, _ = strconv.ParseUint(f[2], 10, 64)
	e.size, _ = strconv.ParseUint(f[3], 10, 64)
	e.sum = f[4]
	return e
}

// roundTrip checks the exporter's bytes through the mapping, overwrites them
// with a scattered restore from pinned memory, and has the exporter verify.
func (e *exporter) roundTrip(t *testing.T, d *Device) {
	t.Helper()
	m, err := d.OpenIPC(e.handle)
	if err != nil {
		t.Fatalf("open IPC handle: %v", err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Errorf("close IPC mapping: %v", err)
		}
	}()
	base := m.Ptr + DevicePtr(e.offset)
	buf := make([]byte, e.size)
	if err := d.CopyFromDevice(buf, base); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%x", sha256.Sum256(buf)); got != e.sum {
		t.Fatalf("imported bytes digest %s, exporter has %s", got, e.sum)
	}
	// Overwrite in 128 KiB blocks in reverse order through the copier.
	h := registerHost(t, d, int(e.size))
	fillRandom(rand.New(rand.NewPCG(9, 10)), h.Bytes())
	var segs []Segment
	for off := uint64(0); off < e.size; off += testSeg {
		segs = append(segs, Segment{HostOff: off, Dev: base + DevicePtr(e.size-testSeg-off), Len: testSeg})
	}
	c, err := d.NewCopier(CopierConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if err := c.Restore(context.Background(), h, segs); err != nil {
		t.Fatalf("restore into IPC mapping: %v", err)
	}
	t.Logf("restored %d MiB into the exporter's buffer with %v in %v (%.1f GB/s)",
		e.size>>20, c.Method(), time.Since(start), float64(e.size)/time.Since(start).Seconds()/1e9)
	hb := h.Bytes()
	want := make([]byte, 0, e.size)
	for off := e.size; off > 0; off -= testSeg {
		want = append(want, hb[off-testSeg:off]...)
	}
	fmt.Fprintf(e.in, "VERIFY %x\n", sha256.Sum256(want))
	line, err := e.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "OK" {
		t.Fatalf("exporter verification: %q, %v", line, err)
	}
}

func TestIPCImportFromOtherProcess(t *testing.T) {
	d := requireDevice(t)
	const size = 64 << 20
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", ipcExporterEnv, size))
	startExporter(t, cmd).roundTrip(t, d)
}

// TestIPCImportFromTorch opens a PyTorch allocation by its IPC handle, as
// the engine connector hands them over. Skipped where python3 has no torch.
func TestIPCImportFromTorch(t *testing.T) {
	d := requireDevice(t)
	py := os.Getenv("ORBITKV_PYTHON")
	if py == "" {
		py = "python3"
	}
	if err := exec.Command(py, "-c", "import torch; assert torch.cuda.is_available()").Run(); err != nil {
		t.Skipf("skipping: %s has no CUDA torch: %v", py, err)
	}
	cmd := exec.Command(py, "testdata/ipc_torch.py", strconv.Itoa(32<<20))
	startExporter(t, cmd).roundTrip(t, d)
}

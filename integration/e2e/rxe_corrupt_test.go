package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// A page corrupted in the holder's DRAM, over real verbs: host-a flips a
// byte of one page in its own peer's memory from outside the process,
// through /proc/PID/mem (the peer has no hook for it), and host-b loads
// the pages by RDMA READ.

// corruptPage is the page host-a corrupts, and where in it.
const corruptPage, corruptAt = 7, 4096

// corrupt flips the byte at corruptAt of page ?page= wherever its bytes
// are in the peer's private anonymous memory (its DRAM pool; every copy
// found), and answers how many copies it changed.
func (h *holderControl) corrupt(w http.ResponseWriter, r *http.Request) {
	i, err := strconv.Atoi(r.URL.Query().Get("page"))
	if err != nil || i < 0 || i >= guestPages {
		http.Error(w, "page: 0…"+strconv.Itoa(guestPages-1), http.StatusBadRequest)
		return
	}
	page := h.page(i)
	n, err := flipInProcess(h.p.cmd.Process.Pid, page[:64], corruptAt)
	if err != nil || n == 0 {
		h.errorf("corrupt page %d: %d copies changed: %v", i, n, err)
		http.Error(w, fmt.Sprintf("%d copies: %v", n, err), http.StatusConflict)
		return
	}
	h.logf("corrupt: page %d's byte %d flipped in %d copies in the peer's memory", i, corruptAt, n)
	fmt.Fprintf(w, "%d", n)
}

// flipInProcess finds every copy of prefix in pid's private anonymous
// read-write mappings and flips (xor 0x5a) the byte at at from its start.
// It returns how many it flipped.
func flipInProcess(pid int, prefix []byte, at int) (int, error) {
	spans, err := anonMappings(pid)
	if err != nil {
		return 0, err
	}
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer mem.Close()
	var found []int64
	const chunk = 8 << 20
	buf := make([]byte, chunk+len(prefix))
	for _, sp := range spans {
		for off := sp[0]; off < sp[1]; off += chunk {
			n, _ := mem.ReadAt(buf[:min(int64(len(buf)), sp[1]-off)], off)
			for k := 0; ; {
				j := bytes.Index(buf[k:n], prefix)
				if j < 0 || k+j >= chunk {
					break
				}
				found = append(found, off+int64(k+j))
				k += j + 1
			}
		}
	}
	for _, a := range found {
		b := make([]byte, 1)
		if _, err := mem.ReadAt(b, a+int64(at)); err != nil {
			return 0, err
		}
		b[0] ^= 0x5a
		if _, err := mem.WriteAt(b, a+int64(at)); err != nil {
			return 0, err
		}
	}
	return len(found), nil
}

// anonMappings lists pid's private read-write mappings with no file, as
// [start, end) addresses.
func anonMappings(pid int) ([][2]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][2]int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[1] != "rw-p" || len(fields) > 5 {
			continue
		}
		var lo, hi int64
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &lo, &hi); err != nil {
			return nil, err
		}
		out = append(out, [2]int64{lo, hi})
	}
	return out, sc.Err()
}

// corruptInHolderDRAM: a byte of one page flipped in host-a's DRAM. host-b's
// load ends by its deadline; the page READ fails its checksum and is
// fetched again over TCP, where host-a's copy is still corrupt: it fails
// (corrupt, not stored) or, had the holder a good copy to serve, arrives
// right; every other page arrives right by RDMA READ; 0 wrong bytes;
// host-a holds no lease afterwards.
func (l *loader) corruptInHolderDRAM(t *testing.T) {
	overTCP := l.series(t, "orbitkv_cluster_rdma_fallback_pages_total")
	corrupt := l.series(t, `orbitkv_cluster_fetched_pages_total{result="corrupt"}`)
	t.Logf("host-a: page %d corrupted in %s copies of its memory", corruptPage, control(t, fmt.Sprintf("/corrupt?page=%d", corruptPage)))
	o := l.load(t, 20*time.Second)
	overTCPNow, corruptNow := l.series(t, "orbitkv_cluster_rdma_fallback_pages_total"), l.series(t, `orbitkv_cluster_fetched_pages_total{result="corrupt"}`)
	t.Logf("corrupt page: %d ok, %d failed, %d wrong in %v %s; pages over TCP %v → %v; corrupt fetches %v → %v",
		o.ok, o.failed, o.wrong, o.took.Round(time.Millisecond), o.err, overTCP, overTCPNow, corrupt, corruptNow)
	if len(o.codes) != len(l.keys) {
		t.Fatalf("the load failed as a whole: %s", o.err)
	}
	for i, c := range o.codes {
		if i != corruptPage && c != pb.PageCode_PAGE_OK {
			t.Fatalf("page %d: %v, want OK (only page %d is corrupt)", i, c, corruptPage)
		}
	}
	if o.wrong != 0 || overTCPNow <= overTCP || o.codes[corruptPage] != pb.PageCode_PAGE_OK && o.codes[corruptPage] != pb.PageCode_PAGE_CORRUPT {
		t.Fatalf("page %d corrupt in host-a's DRAM: %v, %d wrong, %v pages over TCP (want OK or CORRUPT, 0 wrong, retried over TCP)",
			corruptPage, o.codes[corruptPage], o.wrong, overTCPNow-overTCP)
	}
	t.Logf("host-a after the corrupt page: %s", control(t, "/leases"))
}

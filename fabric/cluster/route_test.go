package cluster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/catalog"
)

func TestRank(t *testing.T) {
	dram := func(n int) []catalog.Run { return []catalog.Run{{Tier: catalog.TierDRAM, Pages: n}} }
	ssdFirst := func(n int) []catalog.Run {
		return []catalog.Run{{Tier: catalog.TierSSD, Pages: 1}, {Tier: catalog.TierDRAM, Pages: n - 1}}
	}
	tests := []struct {
		name string
		in   []Holder
		want string
	}{
		{"more leading pages first", []Holder{{Name: "a", Pages: 2, State: RouteAlive, Runs: dram(2)}, {Name: "b", Pages: 5, State: RouteAlive, Runs: dram(5)}}, "b a"},
		{"no page is dropped", []Holder{{Name: "a", Self: true, State: RouteAlive}, {Name: "b", Pages: 1, State: RouteAlive, Runs: dram(1)}}, "b"},
		{"alive before suspect", []Holder{{Name: "a", Pages: 3, State: RouteSuspect}, {Name: "b", Pages: 3, State: RouteAlive, Runs: ssdFirst(3)}}, "b a"},
		{"dram lead before ssd", []Holder{{Name: "a", Pages: 3, State: RouteAlive, Runs: ssdFirst(3)}, {Name: "b", Pages: 3, State: RouteAlive, Runs: dram(3)}}, "b a"},
		{"self on a tie", []Holder{{Name: "a", Pages: 3, State: RouteAlive, Runs: dram(3)}, {Name: "z", Self: true, Pages: 3, State: RouteAlive, Runs: dram(3)}}, "z a"},
		{"name breaks the last tie", []Holder{{Name: "c", Pages: 3, State: RouteAlive, Runs: dram(3)}, {Name: "a", Pages: 3, State: RouteAlive, Runs: dram(3)}}, "a c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var names []string
			for _, h := range Rank(tt.in) {
				names = append(names, h.Name)
			}
			if got := strings.Join(names, " "); got != tt.want {
				t.Errorf("Rank = %q, want %q (%v)", got, tt.want, fmt.Sprint(tt.in))
			}
		})
	}
}

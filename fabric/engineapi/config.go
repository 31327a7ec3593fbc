package engineapi

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/orbitkv/orbitkv/internal/bytesize"
)

// Limits are the engine API's budgets and bounds; the peer's Config embeds
// them (fabric.Config).
type Limits struct {
	LeaseTTL         time.Duration // default lease lifetime
	QueryBudgetBytes bytesize.Size // bytes all live leases may hold at once (0: half the DRAM pool, also its cap)
	Keepalive        time.Duration // a session without a keepalive for this long is closed
	OpDeadline       time.Duration // default deadline of a Save or Load

	MaxKeys  int // most keys in one Lookup
	MaxPages int // most pages in one Save or Load
	// MaxUnwaitedOps bounds a session's operations not yet waited for, so
	// an engine that never calls Wait cannot grow the peer (0: 16384). Not
	// a flag: tests lower it.
	MaxUnwaitedOps int `json:",omitempty"`
}

// maxOps is MaxUnwaitedOps with its default.
func (c *Limits) maxOps() int {
	if c.MaxUnwaitedOps > 0 {
		return c.MaxUnwaitedOps
	}
	return 16384
}

// RegisterFlags binds the limits to flags (documented in docs/configuration.md).
func (c *Limits) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "default lease lifetime")
	fs.Var(&c.QueryBudgetBytes, "query-budget-bytes", "bytes all live leases may hold at once (default and cap: half of --dram-bytes)")
	fs.DurationVar(&c.Keepalive, "keepalive", c.Keepalive, "close a session silent for this long")
	fs.DurationVar(&c.OpDeadline, "op-deadline", c.OpDeadline, "default deadline of a save or load")
	fs.IntVar(&c.MaxKeys, "max-keys", c.MaxKeys, "most keys in one lookup")
	fs.IntVar(&c.MaxPages, "max-pages", c.MaxPages, "most pages in one save or load")
}

// Validate checks the limits.
func (c *Limits) Validate() []error {
	var errs []error
	for name, d := range map[string]time.Duration{"lease-ttl": c.LeaseTTL, "keepalive": c.Keepalive, "op-deadline": c.OpDeadline} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	if c.MaxKeys <= 0 || c.MaxPages <= 0 {
		errs = append(errs, errors.New("max-keys and max-pages must be positive"))
	}
	return errs
}

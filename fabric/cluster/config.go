package cluster

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"

	"github.com/orbitkv/orbitkv/rdma"
)

// Config configures the cluster side of a peer; ClusterAddr "" runs the
// peer standalone. The peer's Config embeds it (fabric.Config).
type Config struct {
	ClusterAddr      string // memberlist gossip bind address (host:port)
	ClusterAdvertise string // address members reach the gossip at (default: memberlist's choice)
	ClusterJoin      string // comma-separated gossip addresses of members to join through
	ClusterKeyFile   string // gossip encryption key (base64, 16/24/32 bytes); "" gossips in clear
	NodeName         string // unique member name (default: kept in DataDir/node-name)
	PeerAddr         string // peer gRPC service listen address (default: gossip host, port+1)
	DataAddr         string // TCP data plane listen address (default: gossip host, port+2)
	TLSCert          string // this peer's certificate (PEM): mutual TLS on the peer service and data plane
	TLSKey           string // its private key (PEM)
	TLSCA            string // the cluster CA (PEM)
	// ClusterInsecure allows a cluster without mutual TLS or without a gossip
	// key: anyone who reaches the ports can then read pages or join.
	ClusterInsecure bool
	// CompactCatalog gossips a filter of this peer's page keys (a few bits
	// a page, changed bit by bit) instead of every page; members confirm a
	// claim with Holds before they count it (summary.go, index.go).
	CompactCatalog bool
	// RDMA is the RDMA data plane (--rdma-devices …): opened at Start; a
	// peer without a usable device uses TCP (rdma.go, transport.go).
	RDMA rdma.Config
}

// RegisterFlags binds the cluster flags (documented in docs/configuration.md).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.ClusterAddr, "cluster-addr", c.ClusterAddr, "gossip bind address host:port (e.g. 0.0.0.0:7946); empty runs standalone")
	fs.StringVar(&c.ClusterAdvertise, "cluster-advertise", c.ClusterAdvertise, "gossip address members reach this peer at (default: chosen by memberlist)")
	fs.StringVar(&c.ClusterJoin, "cluster-join", c.ClusterJoin, "comma-separated gossip addresses of members to join through")
	fs.StringVar(&c.ClusterKeyFile, "cluster-key-file", c.ClusterKeyFile, "gossip encryption key file (base64 of 16/24/32 bytes; orbitkv pki init writes one)")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "unique member name (default: kept in DATA-DIR/node-name)")
	fs.StringVar(&c.PeerAddr, "peer-addr", c.PeerAddr, "peer gRPC listen address (default: gossip host, port+1)")
	fs.StringVar(&c.DataAddr, "data-addr", c.DataAddr, "TCP data plane listen address (default: gossip host, port+2)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "peer certificate (PEM) for mutual TLS between peers")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "private key of --tls-cert (PEM)")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "cluster CA certificate (PEM)")
	c.RDMA.RegisterFlags(fs) // --rdma-devices (empty: auto-detect; none: off), --rdma-gid-index, …
	fs.BoolVar(&c.CompactCatalog, "cluster-compact-catalog", c.CompactCatalog, "gossip a compact filter of this peer's pages instead of every page (large clusters; a claim is confirmed with its holder before a lookup counts it)")
	fs.BoolVar(&c.ClusterInsecure, "cluster-insecure", c.ClusterInsecure, "allow a cluster without mutual TLS or gossip encryption (trusted test networks only)")
}

// Validate checks the cluster flags and fills the peer and data addresses
// from the gossip address.
func (c *Config) Validate() []error {
	if c.ClusterAddr == "" {
		for name, v := range map[string]string{"cluster-join": c.ClusterJoin, "peer-addr": c.PeerAddr, "data-addr": c.DataAddr,
			"tls-cert": c.TLSCert, "cluster-key-file": c.ClusterKeyFile} {
			if v != "" {
				return []error{fmt.Errorf("%s needs --cluster-addr", name)}
			}
		}
		return nil
	}
	host, port, err := splitHostPort(c.ClusterAddr)
	if err != nil {
		return []error{fmt.Errorf("cluster-addr %q: %w", c.ClusterAddr, err)}
	}
	next := func(d int) string {
		if port == 0 {
			return net.JoinHostPort(host, "0")
		}
		return net.JoinHostPort(host, strconv.Itoa(port+d))
	}
	if c.PeerAddr == "" {
		c.PeerAddr = next(1)
	}
	if c.DataAddr == "" {
		c.DataAddr = next(2)
	}
	var errs []error
	for name, v := range map[string]string{"peer-addr": c.PeerAddr, "data-addr": c.DataAddr} {
		if _, _, err := splitHostPort(v); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, v, err))
		}
	}
	set := btoi(c.TLSCert != "") + btoi(c.TLSKey != "") + btoi(c.TLSCA != "")
	if set != 0 && set != 3 {
		errs = append(errs, errors.New("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca"))
	}
	if (set == 0 || c.ClusterKeyFile == "") && !c.ClusterInsecure {
		errs = append(errs, errors.New("a cluster needs --tls-cert, --tls-key, --tls-ca and --cluster-key-file "+
			"(orbitkv pki init / issue make them); without them anyone reaching the ports reads pages or joins: "+
			"--cluster-insecure allows that on a trusted test network"))
	}
	if len(c.NodeName) > maxNameLen {
		errs = append(errs, fmt.Errorf("node-name of %d bytes, at most %d", len(c.NodeName), maxNameLen))
	}
	return errs
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

package fabric

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/buildinfo"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/dram"
)

// rpcMetrics are the rate, errors and duration of every engine and admin
// RPC on the Unix socket (a unary interceptor on the peer's gRPC server).
// Every method and code is present, at zero, from the start.
type rpcMetrics struct {
	seconds *prometheus.HistogramVec // {method}
	calls   *prometheus.CounterVec   // {method, code}
}

// rpcCodes are the gRPC codes exported at zero: OK, those of the engine
// API's error table (fabric/engineapi/errors.go) and its fallback,
// Internal, and Unknown, which gRPC reports for an error that is not a
// status. A code outside them is still counted, from its first call.
var rpcCodes = []codes.Code{codes.OK, codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound, codes.Unavailable,
	codes.ResourceExhausted, codes.DeadlineExceeded, codes.Canceled, codes.Internal, codes.Unknown}

func newRPCMetrics(reg prometheus.Registerer) *rpcMetrics {
	m := &rpcMetrics{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "orbitkv", Subsystem: "fabric", Name: "rpc_duration_seconds",
			Help:    "Engine and admin RPCs on the Unix socket: time to answer, by method.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}, []string{"method"}), // 50 µs .. 1.6 s
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "fabric", Name: "rpcs_total",
			Help: "Engine and admin RPCs answered, by method and gRPC code."}, []string{"method", "code"}),
	}
	for _, sd := range []grpc.ServiceDesc{pb.EngineService_ServiceDesc, pb.AdminService_ServiceDesc} {
		for _, md := range sd.Methods {
			m.seconds.WithLabelValues(md.MethodName)
			for _, c := range rpcCodes {
				m.calls.WithLabelValues(md.MethodName, c.String())
			}
		}
	}
	reg.MustRegister(m.seconds, m.calls)
	return m
}

// unary is the server's interceptor: it times and counts every call.
func (m *rpcMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	method := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
	m.seconds.WithLabelValues(method).Observe(time.Since(start).Seconds())
	m.calls.WithLabelValues(method, status.Code(err).String()).Inc()
	return resp, err
}

// registerBuildInfo exports orbitkv_build_info{version,revision,go} = 1.
func registerBuildInfo(reg prometheus.Registerer) {
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "orbitkv", Name: "build_info",
		Help: "Always 1; the labels name the running build."}, []string{"version", "revision", "go"})
	info.WithLabelValues(buildinfo.Version(), buildinfo.Revision(), buildinfo.GoVersion()).Set(1)
	reg.MustRegister(info)
}

// registerPoolGauges exports what the DRAM pool can still hand out. Used
// bytes over capacity understates a full pool: slabs are cut into one slot
// size each, so with pages that do not divide a slab, or slabs bound to a
// page size no engine saves any more, saves evict (or fail) while used
// bytes are well below capacity. free_bytes is what an allocation can get.
func registerPoolGauges(reg prometheus.Registerer, pool *dram.Pool) {
	opts := func(name, help string) prometheus.GaugeOpts {
		return prometheus.GaugeOpts{Namespace: "orbitkv", Subsystem: "tiers", Name: name, Help: help}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(opts("dram_free_bytes", "DRAM the pool can still hand out: whole free slabs and free slots of cut slabs (0: effectively full)."),
			func() float64 { return float64(pool.FreeBytes()) }),
		prometheus.NewGaugeFunc(opts("dram_free_slabs", "DRAM slabs not yet bound to a page size."),
			func() float64 { return float64(pool.FreeSlabs()) }),
	)
}

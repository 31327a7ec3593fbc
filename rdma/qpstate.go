package rdma

import "fmt"

// The RC queue pair state machine, as the engine drives it:
//
//	RESET ─init─► INIT ─rtr(peer)─► RTR ─rts─► RTS ──(error completion,
//	  ▲                                          │     timeout, Close)
//	  └──────────────── reset ◄── drain ◄── ERR ◄┘
//
// A lane is connected when its QP is in RTS. On an error completion the
// hardware moves the QP to ERR itself and flushes every outstanding work
// request; on a timeout the engine moves it to ERR. Either way the engine
// drains the flushed completions before it touches the QP again, then
// resets it, takes a new PSN and reconnects through the connection's
// exchange (conn.go recover). These functions are pure: they build the
// attributes of each transition from explicit inputs and check that a
// transition is legal, so the fake can refuse what hardware refuses.

// legalTransition reports whether ibv_modify_qp may take a QP from cur to
// next (the subset of the IB spec's table the engine uses).
func legalTransition(cur, next QPState) bool {
	switch next {
	case QPReset, QPErr:
		return true
	case QPInit:
		return cur == QPReset || cur == QPInit
	case QPRTR:
		return cur == QPInit
	case QPRTS:
		return cur == QPRTR || cur == QPRTS
	}
	return false
}

// laneEnd is this side's view of its QP: what it needs to reach RTS.
type laneEnd struct {
	Port      uint8
	GIDIndex  uint8
	LinkLayer uint8
	MTU       MTU // effective: min(active, Config.MaxMTU)
	PSN       uint32
}

// Timer values of the RTR and RTS transitions. Timeout 14 is 4.096 µs ×
// 2^14 ≈ 67 ms per retry; 7 retries bound a dead peer's detection to about
// half a second per work request, well inside a batch deadline.
const (
	attrTimeout     = 14
	attrRetryCnt    = 7
	attrRNRRetry    = 7
	attrMinRNRTimer = 12
	attrRdAtomic    = 16
)

// negotiatedMTU is the path MTU both ends use: the smaller of the two
// effective MTUs. (Each end configuring its own active MTU breaks READs
// between ports of different MTUs: Mooncake issue 3868.)
func negotiatedMTU(local, peer MTU) MTU { return min(local, peer) }

func initAttr(l laneEnd) qpAttr {
	return qpAttr{State: QPInit, Port: l.Port, Access: accessAll} // per-QP gate; each MR narrows it
}

func rtrAttr(l laneEnd, peer LaneInfo) qpAttr {
	return qpAttr{
		State: QPRTR, Port: l.Port, MTU: negotiatedMTU(l.MTU, peer.MTU),
		DestQPN: peer.QPN, RQPSN: peer.PSN,
		DGID: peer.GID, DLID: peer.LID, SGIDIndex: l.GIDIndex,
		Global:          l.LinkLayer == linkEthernet || peer.GID != (GID{}) && peer.LID == 0,
		MaxDestRdAtomic: attrRdAtomic, MinRNRTimer: attrMinRNRTimer,
	}
}

func rtsAttr(l laneEnd) qpAttr {
	return qpAttr{
		State: QPRTS, SQPSN: l.PSN, MaxRdAtomic: attrRdAtomic,
		Timeout: attrTimeout, RetryCnt: attrRetryCnt, RNRRetry: attrRNRRetry,
	}
}

// connectQP takes a QP from any state to RTS against peer: RESET first
// (some NICs refuse INIT from a state they left: Mooncake's E810 note),
// then INIT, RTR, RTS. It names the step that failed.
func connectQP(v verbs, qp handle, nic string, l laneEnd, peer LaneInfo) error {
	steps := []qpAttr{{State: QPReset}, initAttr(l), rtrAttr(l, peer), rtsAttr(l)}
	for _, a := range steps {
		if err := v.modifyQP(qp, a); err != nil {
			return fmt.Errorf("connect %s to %s qpn %#x (mtu %d, gid %s, lid %d): to %s: %w",
				nic, peer.NIC, peer.QPN, a.MTU.Bytes(), peer.GID, peer.LID, a.State, err)
		}
	}
	return nil
}

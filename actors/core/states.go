package core

import "fmt"

// TxState is a context-side session's state.
//
//	INIT → READY → TRANSFERRING → DONE
//	any non-terminal → FAILED | CANCELLED
//
// INIT: no peer has asked for the request yet. READY: at least one peer's
// RequestData is known. TRANSFERRING: an op reached a worker. The first
// terminal state wins and is never overwritten.
type TxState uint8

// TxSession states.
const (
	TxInit TxState = iota
	TxReady
	TxTransferring
	TxDone
	TxFailed
	TxCancelled
)

// NumTxStates is the number of TxState values (TxInit..TxCancelled).
const NumTxStates = len(txNames)

var txNames = [...]string{"INIT", "READY", "TRANSFERRING", "DONE", "FAILED", "CANCELLED"}

func (s TxState) String() string {
	if int(s) < len(txNames) {
		return txNames[s]
	}
	return fmt.Sprintf("TxState(%d)", uint8(s))
}

// Terminal reports whether s is DONE, FAILED or CANCELLED.
func (s TxState) Terminal() bool { return s >= TxDone }

// RxState is a generation-side session's state.
//
//	REQUESTED → RECEIVING → READY
//	any non-terminal → FAILED | CANCELLED | TIMED_OUT
type RxState uint8

// RxSession states.
const (
	RxRequested RxState = iota
	RxReceiving
	RxReady
	RxFailed
	RxCancelled
	RxTimedOut
)

// NumRxStates is the number of RxState values (RxRequested..RxTimedOut).
const NumRxStates = len(rxNames)

var rxNames = [...]string{"REQUESTED", "RECEIVING", "READY", "FAILED", "CANCELLED", "TIMED_OUT"}

func (s RxState) String() string {
	if int(s) < len(rxNames) {
		return rxNames[s]
	}
	return fmt.Sprintf("RxState(%d)", uint8(s))
}

// Terminal reports whether s is READY, FAILED, CANCELLED or TIMED_OUT.
func (s RxState) Terminal() bool { return s >= RxReady }

// Status is a request's terminal outcome as its handle reports it.
type Status uint8

// Outcomes. DONE is the context side's success, READY the generation
// side's; a failure is FAILED, CANCELLED or TIMED_OUT.
const (
	StatusUnknown Status = iota
	StatusDone
	StatusReady
	StatusFailed
	StatusCancelled
	StatusTimedOut
)

var statusNames = [...]string{"UNKNOWN", "DONE", "READY", "FAILED", "CANCELLED", "TIMED_OUT"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// OK reports whether s is a success (DONE or READY).
func (s Status) OK() bool { return s == StatusDone || s == StatusReady }

// Status is a terminal state's outcome (StatusUnknown for a live state).
func (s TxState) Status() Status {
	switch s {
	case TxDone:
		return StatusDone
	case TxFailed:
		return StatusFailed
	case TxCancelled:
		return StatusCancelled
	}
	return StatusUnknown
}

// Status is a terminal state's outcome (StatusUnknown for a live state).
func (s RxState) Status() Status {
	switch s {
	case RxReady:
		return StatusReady
	case RxFailed:
		return StatusFailed
	case RxCancelled:
		return StatusCancelled
	case RxTimedOut:
		return StatusTimedOut
	}
	return StatusUnknown
}

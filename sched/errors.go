package sched

import (
	"errors"
	"strings"
)

// Sentinel errors; match them with errors.Is.
var (
	// ErrInvalidRequest: the request (or its JSON) is malformed. The error
	// text says which field.
	ErrInvalidRequest = errors.New("sched: invalid request")
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("sched: invalid config")
	// ErrInvalidState: a State does not fit the cluster (unknown host or
	// device, a device held twice, a duplicate reservation ID).
	ErrInvalidState = errors.New("sched: invalid state")
	// ErrInfeasible: no placement satisfies the request. The error is an
	// *InfeasibleError that lists every reason.
	ErrInfeasible = errors.New("sched: request is infeasible")
	// ErrUnknownReservation: no reservation has the given ID.
	ErrUnknownReservation = errors.New("sched: unknown reservation")
	// ErrDuplicateReservation: a reservation with the ID exists already.
	ErrDuplicateReservation = errors.New("sched: duplicate reservation")
	// ErrUnknownHost / ErrUnknownDevice: a name that is not in the cluster.
	ErrUnknownHost   = errors.New("sched: unknown host")
	ErrUnknownDevice = errors.New("sched: unknown device")
)

// InfeasibleError is returned with ErrInfeasible; Reasons holds every
// reason found, in a deterministic order.
type InfeasibleError struct {
	Reasons []string
}

func (e *InfeasibleError) Error() string {
	if len(e.Reasons) == 0 {
		return ErrInfeasible.Error()
	}
	return ErrInfeasible.Error() + ": " + strings.Join(e.Reasons, "; ")
}

// Unwrap makes errors.Is(err, ErrInfeasible) hold.
func (e *InfeasibleError) Unwrap() error { return ErrInfeasible }

package sqlstore

// Classify exposes the dialect's reading of a driver error, for the tests.
func Classify(d Dialect, err error) string {
	switch d.classify(err) {
	case errDuplicate:
		return "duplicate"
	case errLocked:
		return "locked"
	case errDeadlock:
		return "deadlock"
	case errTooLarge:
		return "too large"
	}
	return "other"
}

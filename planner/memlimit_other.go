//go:build !linux

package planner

func processMemLimit() MemLimit {
	if ram := MemTotal(); ram > 0 {
		return MemLimit{Bytes: ram, What: "this machine's " + units.Bytes(ram)}
	}
	return MemLimit{}
}

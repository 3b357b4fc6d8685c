package images

// DiskUse is what `kiln-images du` counts for dir (hard links once), for
// the benchmarks of the external test package.
var DiskUse = diskUse

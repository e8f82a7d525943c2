// Datatypes as libaapc-mpi carries them (op.cpp): a call's blocks in bytes, in place for
// a contiguous datatype, else packed with MPI_Pack and unpacked with MPI_Unpack; the byte
// datatypes of the hand-overs; and a nonblocking call's hold on the program's datatypes.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "op.hpp"

namespace aapc::mpi {

namespace {

constexpr std::uint64_t kChunk = 1ULL << 30;  // hindexed block lengths are ints

// A datatype's layout: contiguous ones are carried in place.
struct TypeInfo {
  MPI_Aint extent = 0;
  std::uint64_t size = 0;
  bool contiguous = false;
};

bool in_order(MPI_Datatype t, int depth);

// Whether `t` is predefined: named, or a parameterized Fortran type (MPI_Type_create_f90_*,
// whose combiner is its own). MPI_Type_get_contents hands such a type back as it is, and it
// may not be freed (MPI 4.0, 5.1.13); a derived one it hands back as a new handle.
bool predefined(MPI_Datatype t) {
  int ni = 0, na = 0, nd = 0, combiner = MPI_COMBINER_NAMED;
  PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner);
  return combiner == MPI_COMBINER_NAMED || combiner == MPI_COMBINER_F90_REAL || combiner == MPI_COMBINER_F90_COMPLEX ||
         combiner == MPI_COMBINER_F90_INTEGER;
}

// Whether `t` covers its extent without gaps, from 0, with its bytes in the order of its type
// map: then packing it copies its bytes as they lie. Extent and size alone do not say so: a
// block transposed by its datatype (a vector of one element per row, resized to one element,
// made contiguous) has no gaps either, and its bytes must move.
TypeInfo type_info(MPI_Datatype t, int depth = 0) {
  MPI_Aint lb = 0, extent = 0, true_lb = 0, true_extent = 0;
  MPI_Count size = 0;
  PMPI_Type_get_extent(t, &lb, &extent);
  PMPI_Type_get_true_extent(t, &true_lb, &true_extent);
  PMPI_Type_size_x(t, &size);
  TypeInfo i;
  i.extent = extent;
  i.size = static_cast<std::uint64_t>(size);
  i.contiguous = lb == 0 && true_lb == 0 && static_cast<MPI_Count>(extent) == size && static_cast<MPI_Count>(true_extent) == size && in_order(t, depth);
  return i;
}

// Whether `t`'s type map lists its bytes in increasing order, each once: a predefined type, or
// one made of such a type, gapless, by dup, contiguous, resized, or a vector whose stride is its
// block. Others are taken as out of order (they are packed, which is always right).
bool in_order(MPI_Datatype t, int depth) {
  if (predefined(t)) return true;
  int ni = 0, na = 0, nd = 0, combiner = MPI_COMBINER_NAMED;
  PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner);
  const bool layered = combiner == MPI_COMBINER_DUP || combiner == MPI_COMBINER_CONTIGUOUS || combiner == MPI_COMBINER_RESIZED ||
                       combiner == MPI_COMBINER_VECTOR || combiner == MPI_COMBINER_HVECTOR;
  if (!layered || nd != 1 || depth > 32) return false;
  std::vector<int> ints(static_cast<std::size_t>(ni));
  std::vector<MPI_Aint> addrs(static_cast<std::size_t>(na));
  MPI_Datatype inner = MPI_DATATYPE_NULL;
  PMPI_Type_get_contents(t, ni, na, nd, ints.data(), addrs.data(), &inner);
  const TypeInfo in = type_info(inner, depth + 1);
  bool ok = in.contiguous;
  if (combiner == MPI_COMBINER_VECTOR) ok = ok && (ints[0] <= 1 || ints[1] == ints[2]);  // count, blocklength, stride (elements)
  if (combiner == MPI_COMBINER_HVECTOR) ok = ok && (ints[0] <= 1 || static_cast<MPI_Aint>(ints[1]) * in.extent == addrs[0]);  // ... stride in bytes
  if (!predefined(inner)) PMPI_Type_free(&inner);  // get_contents gave a new handle
  return ok;
}

// `call(buffer, count, type)` for `count` `type`s at the program's `user`: MPICH 4.0's
// MPI_Pack and MPI_Unpack refuse a null buffer, which MPI_BOTTOM is (with a datatype of
// absolute addresses, a block of a Fortran program's MPI_BOTTOM among them); there the
// elements go as one of a type shifted back by the address of a byte of this library.
template <typename Call>
int at_user(const void* user, int count, MPI_Datatype type, Call call) {
  if (user != nullptr || count == 0) return call(const_cast<void*>(user), count, type);
  static char anchor = 0;
  MPI_Aint displ = -reinterpret_cast<MPI_Aint>(&anchor);
  MPI_Datatype shifted = MPI_DATATYPE_NULL;
  PMPI_Type_create_hindexed(1, &count, &displ, type, &shifted);
  PMPI_Type_commit(&shifted);
  const int rc = call(&anchor, 1, shifted);
  PMPI_Type_free(&shifted);
  return rc;
}

// Every block of `side` between the user's buffer and b's packed bytes (MPI_Pack, or
// MPI_Unpack when not `into_packed`), in runs of at most 2 GiB (element_runs).
void packing(const Side& side, const TypeInfo& t, MPI_Comm comm, const Blocks& b, bool into_packed) {
  if (t.size == 0) return;  // no bytes to move (and MPICH 4.0's MPI_Unpack divides by the size)
  for (std::size_t r = 0; r < side.counts.size(); ++r) {
    auto* user = static_cast<std::uint8_t*>(side.buf) + side.displs[r] * t.extent;
    for (const Run& run : element_runs(static_cast<std::uint64_t>(side.counts[r]), t.size)) {
      std::uint8_t* elements = user + static_cast<std::int64_t>(run.first) * t.extent;
      std::uint8_t* packed = b.base + b.by_rank[r].offset + run.first * t.size;
      const int bytes = static_cast<int>(std::min<std::uint64_t>(static_cast<std::uint64_t>(run.elements) * t.size, std::numeric_limits<int>::max()));
      int position = 0;
      if (into_packed)
        pack_from(elements, run.elements, side.type, packed, bytes, &position, comm);
      else
        unpack_into(packed, bytes, &position, elements, run.elements, side.type, comm);
    }
  }
}

}  // namespace

Blocks blocks_of(const Side& side, int n, MPI_Comm comm, std::vector<std::uint8_t>& packed, bool pack) {
  const TypeInfo t = type_info(side.type);
  Blocks b;
  b.by_rank.resize(static_cast<std::size_t>(n));
  std::uint64_t total = 0;
  for (int r = 0; r < n; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const std::uint64_t len = static_cast<std::uint64_t>(side.counts[ur]) * t.size;
    b.by_rank[ur] = t.contiguous ? Piece{static_cast<std::uint64_t>(side.displs[ur] * t.extent), len} : Piece{total, len};
    total += len;
  }
  if (t.contiguous) {
    b.base = static_cast<std::uint8_t*>(side.buf);
    return b;
  }
  packed.resize(std::max<std::uint64_t>(total, 1));
  b.base = packed.data();
  if (pack) packing(side, t, comm, b, true);
  return b;
}

void unpack(const Side& side, MPI_Comm comm, const Blocks& b) { packing(side, type_info(side.type), comm, b, false); }

int pack_from(const void* user, int count, MPI_Datatype type, void* packed, int size, int* position, MPI_Comm comm) {
  return at_user(user, count, type, [&](void* buf, int n, MPI_Datatype t) { return PMPI_Pack(buf, n, t, packed, size, position, comm); });
}

int unpack_into(const void* packed, int size, int* position, void* user, int count, MPI_Datatype type, MPI_Comm comm) {
  return at_user(user, count, type, [&](void* buf, int n, MPI_Datatype t) { return PMPI_Unpack(packed, size, position, buf, n, t, comm); });
}


MPI_Datatype HeldTypes::hold(MPI_Datatype t) {
  if (predefined(t)) return t;
  MPI_Datatype d = MPI_DATATYPE_NULL;
  PMPI_Type_dup(t, &d);
  dups_.push_back(d);
  return d;
}

HeldTypes::~HeldTypes() {
  for (MPI_Datatype& t : dups_) PMPI_Type_free(&t);
}

ByteType::ByteType(const std::vector<Piece>& pieces) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> displs;
  for (const Piece& p : pieces)
    for (std::uint64_t done = 0; done < p.length; done += kChunk) {
      lengths.push_back(static_cast<int>(std::min(kChunk, p.length - done)));
      displs.push_back(static_cast<MPI_Aint>(p.offset + done));
    }
  if (lengths.empty()) return;
  PMPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(), displs.data(), MPI_BYTE, &type_);
  PMPI_Type_commit(&type_);
  count_ = 1;
}

ByteType::~ByteType() {
  if (count_ != 0) PMPI_Type_free(&type_);
}

}  // namespace aapc::mpi

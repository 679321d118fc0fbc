#include "data/H5File.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "data/H5Check.h"

namespace mt {

const EnumTable<FileLocking>& fileLockings() {
  static const EnumTable<FileLocking> kTable = {
      {FileLocking::kAuto, "auto", "HDF5_USE_FILE_LOCKING decides"}, {FileLocking::kOn, "on"}, {FileLocking::kOff, "off"}};
  return kTable;
}

namespace {

// HDF5 prints its error stack to stderr by default; we turn the innermost message into our own
// error instead. The setting is per thread in thread-safe builds, so every entry point calls this.
void silenceHdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

[[noreturn]] void dataError(const std::string& file, const std::string& what) {
  throw DataError("data file " + file + ": " + what);
}

std::string typeNameOf(hid_t type, size_t* size, bool* littleEndian) {
  *size = H5Tget_size(type);
  *littleEndian = H5Tget_order(type) != H5T_ORDER_BE;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      const bool isSigned = H5Tget_sign(type) == H5T_SGN_2;
      return std::string(isSigned ? "i" : "u") + std::to_string(*size * 8);
    }
    case H5T_FLOAT: return "f" + std::to_string(*size * 8);
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    default: return "other";
  }
}

}  // namespace

bool H5DatasetInfo::directReadable() const {
  if (!littleEndian) return false;
  if (storage == H5Storage::kContiguous) return filters.empty() && contiguousOffset != HADDR_UNDEF;
  if (storage != H5Storage::kChunked) return false;
  for (H5Filter f : filters)
    if (f == H5Filter::kOther) return false;
  return true;
}

int64_t H5DatasetInfo::rowElements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

hid_t h5NativeType(DType t) {
  switch (t) {
    case DType::kF32: return H5T_NATIVE_FLOAT;
    case DType::kI32: return H5T_NATIVE_INT32;
    case DType::kI64: return H5T_NATIVE_INT64;
    case DType::kU8: return H5T_NATIVE_UINT8;
    case DType::kF64: return H5T_NATIVE_DOUBLE;
    case DType::kBF16:
    case DType::kF16: return H5T_NATIVE_UINT16;  // stored as raw 16-bit patterns
  }
  return H5T_NATIVE_UINT8;
}

H5File H5File::open(const std::string& path, FileLocking locking) {
  silenceHdf5();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) dataError(path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) dataError(path, "not a regular file");
  htri_t isH5 = H5Fis_hdf5(path.c_str());
  if (isH5 <= 0) {
    std::string why = isH5 == 0 ? "not an HDF5 file" : detail::hdf5ErrorString();
    dataError(path, why);
  }
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  if (locking != FileLocking::kAuto)
    H5_CHECK(H5Pset_file_locking(fapl.get(), locking == FileLocking::kOn, /*ignore_when_disabled=*/true), path);
#endif
  hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (fid < 0) dataError(path, "cannot open: " + detail::hdf5ErrorString());
  H5File f;
  f.path_ = path;
  f.file_ = H5Handle(fid, H5Fclose);
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) dataError(path, std::strerror(errno));
  f.fileSize_ = static_cast<uint64_t>(st.st_size);
  return f;
}

H5File::~H5File() {
  if (fd_ >= 0) ::close(fd_);
}

H5File::H5File(H5File&& o) noexcept
    : path_(std::move(o.path_)), file_(std::move(o.file_)), fd_(o.fd_), fileSize_(o.fileSize_) {
  o.fd_ = -1;
}

H5File& H5File::operator=(H5File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    file_ = std::move(o.file_);
    fd_ = o.fd_;
    fileSize_ = o.fileSize_;
    o.fd_ = -1;
  }
  return *this;
}

bool H5File::hasDataset(const std::string& name) const {
  silenceHdf5();
  // Walk the path so a missing intermediate group is "absent", not an error.
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    size_t next = name.find('/', pos + 1);
    partial = name.substr(0, next);
    if (!partial.empty() && partial != "/") {
      if (H5Lexists(file_.get(), partial.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    pos = next;
  }
  H5O_info_t info;
#if H5_VERSION_GE(1, 12, 0)
  if (H5Oget_info_by_name3(file_.get(), name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return false;
#else
  if (H5Oget_info_by_name2(file_.get(), name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return false;
#endif
  return info.type == H5O_TYPE_DATASET;
}

H5DatasetInfo H5File::describe(const std::string& name, uint64_t listLimit) const {
  silenceHdf5();
  if (!hasDataset(name)) dataError(path_, "dataset " + name + " not found");
  H5Handle d(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.valid()) dataError(path_, "cannot open dataset " + name + ": " + detail::hdf5ErrorString());
  H5DatasetInfo info;
  info.file = path_;
  info.name = name;
  H5Handle type(H5Dget_type(d.get()), H5Tclose);
  info.type = typeNameOf(type.get(), &info.elementSize, &info.littleEndian);
  H5Handle space(H5Dget_space(d.get()), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) dataError(path_, "dataset " + name + ": cannot read its shape");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  for (hsize_t v : dims) info.shape.push_back(static_cast<int64_t>(v));

  H5Handle dcpl(H5Dget_create_plist(d.get()), H5Pclose);
  H5D_layout_t layout = H5Pget_layout(dcpl.get());
  int nfilters = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < nfilters; ++i) {
    unsigned flags = 0;
    size_t nelem = 0;
    unsigned filterConfig = 0;
    char fname[64] = {0};
    H5Z_filter_t id = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nelem, nullptr, sizeof(fname),
                                     fname, &filterConfig);
    if (H5Zfilter_avail(id) <= 0)
      info.unavailableFilters.push_back(std::string(fname[0] ? fname : "unnamed") + " (id " + std::to_string(id) + ")");
    info.filters.push_back(id == H5Z_FILTER_DEFLATE      ? H5Filter::kDeflate
                           : id == H5Z_FILTER_SHUFFLE    ? H5Filter::kShuffle
                           : id == H5Z_FILTER_FLETCHER32 ? H5Filter::kFletcher32
                                                         : H5Filter::kOther);
  }
  if (layout == H5D_CONTIGUOUS) {
    info.storage = H5Storage::kContiguous;
    info.contiguousOffset = H5Dget_offset(d.get());
    // A file cut short must not be read past its end by pread.
    const uint64_t bytes = static_cast<uint64_t>(shapeNumel(info.shape)) * info.elementSize;
    if (info.contiguousOffset != HADDR_UNDEF && info.contiguousOffset + bytes > fileSize_)
      dataError(path_, "dataset " + name + " extends past the end of the file (truncated file?)");
  } else if (layout == H5D_CHUNKED) {
    info.storage = H5Storage::kChunked;
    std::vector<hsize_t> cdims(static_cast<size_t>(rank));
    H5_CHECK(H5Pget_chunk(dcpl.get(), rank, cdims.data()), path_, ": ", name);
    for (hsize_t v : cdims) info.chunkShape.push_back(static_cast<int64_t>(v));
    hsize_t nchunks = 0;  // one walk of the index: linear
    H5_CHECK(H5Dget_num_chunks(d.get(), space.get(), &nchunks), path_, ": ", name);
    info.allocatedChunks = nchunks;
    info.chunksListed = nchunks <= listLimit;
    if (info.chunksListed) listChunks(d.get(), space.get(), nchunks, &info);
  } else {
    info.storage = H5Storage::kCompact;
  }
  return info;
}

// Every allocated chunk's origin, address, size and mask: n calls of H5Dget_chunk_info, each a walk
// of the index up to its chunk (O(n^2) in all), so only for the few chunks under the listing limit.
void H5File::listChunks(hid_t dataset, hid_t space, uint64_t nchunks, H5DatasetInfo* info) const {
  const std::string& name = info->name;
  info->chunks.reserve(nchunks);
  std::vector<hsize_t> origin(info->shape.size());
  for (hsize_t i = 0; i < nchunks; ++i) {
    H5Chunk c;
    unsigned mask = 0;
    haddr_t addr = 0;
    hsize_t size = 0;
    H5_CHECK(H5Dget_chunk_info(dataset, space, i, origin.data(), &mask, &addr, &size), path_, ": ", name);
    for (hsize_t v : origin)
      c.origin.push_back(static_cast<int64_t>(v));
    c.address = addr;
    c.size = size;
    c.filterMask = mask;
    if (addr != HADDR_UNDEF && addr + size > fileSize_)
      dataError(path_, "dataset " + name + ": chunk at row " + std::to_string(c.origin[0]) +
                           " lies past the end of the file (truncated file?)");
    info->chunks.push_back(std::move(c));
  }
  std::sort(info->chunks.begin(), info->chunks.end(),
            [](const H5Chunk& a, const H5Chunk& b) { return a.origin < b.origin; });
}

H5Handle H5File::openDataset(const std::string& name) const {
  silenceHdf5();
  H5Handle d(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.valid()) dataError(path_, "cannot open dataset " + name + ": " + detail::hdf5ErrorString());
  return d;
}

bool H5File::readRawChunk(hid_t dataset, const H5DatasetInfo& info, const std::vector<int64_t>& origin,
                          std::vector<char>* raw, uint32_t* filterMask) const {
  silenceHdf5();  // per thread: the loader's workers call this
  const std::vector<hsize_t> offset(origin.begin(), origin.end());
  const std::string what = "chunk at row " + std::to_string(origin[0]) + " of " + info.name;
  hsize_t bytes = 0;
  if (H5Dget_chunk_storage_size(dataset, offset.data(), &bytes) < 0)
    dataError(path_, "cannot find " + what + ": " + detail::hdf5ErrorString());
  if (bytes == 0) return false;
  // A corrupt index must not size a buffer past what the file can hold.
  if (bytes > fileSize_)
    dataError(path_, what + " claims " + std::to_string(bytes) + " bytes, more than the file's " +
                         std::to_string(fileSize_) + " (corrupt file?)");
  raw->resize(bytes);
  if (H5Dread_chunk(dataset, H5P_DEFAULT, offset.data(), filterMask, raw->data()) < 0)
    dataError(path_,
              "cannot read " + what + ": " + detail::hdf5ErrorString() + " (truncated or corrupt file?)");
  return true;
}

void H5File::readRows(const H5DatasetInfo& info, int64_t start, int64_t count, void* dst) const {
  silenceHdf5();
  if (count <= 0) return;
  H5Handle d(H5Dopen2(file_.get(), info.name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.valid()) dataError(path_, "cannot open dataset " + info.name);
  H5Handle ftype(H5Dget_type(d.get()), H5Tclose);
  H5Handle mtype(H5Tget_native_type(ftype.get(), H5T_DIR_ASCEND), H5Tclose);
  H5Handle fspace(H5Dget_space(d.get()), H5Sclose);
  if (H5Sget_simple_extent_ndims(fspace.get()) == 0) {  // scalar
    if (H5Dread(d.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
      dataError(path_, "reading " + info.name + ": " + detail::hdf5ErrorString());
    return;
  }
  std::vector<hsize_t> offs(info.shape.size(), 0), cnt(info.shape.begin(), info.shape.end());
  offs[0] = static_cast<hsize_t>(start);
  cnt[0] = static_cast<hsize_t>(count);
  H5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, offs.data(), nullptr, cnt.data(), nullptr), path_);
  H5Handle mspace(H5Screate_simple(static_cast<int>(cnt.size()), cnt.data(), nullptr), H5Sclose);
  if (H5Dread(d.get(), mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, dst) < 0)
    dataError(path_, "reading rows [" + std::to_string(start) + ", " + std::to_string(start + count) + ") of " +
                         info.name + ": " + detail::hdf5ErrorString());
}

Tensor H5File::readTensor(const std::string& name) const {
  H5DatasetInfo info = describe(name);
  DType dt;
  if (info.type == "u16") {
    const std::string tag = readStringAttribute(name, "dtype");
    if (tag != "bf16" && tag != "f16") dataError(path_, "dataset " + name + " has type u16 without a bf16/f16 tag");
    parseDType(tag, &dt);
  } else if (!parseDType(info.type, &dt)) {
    dataError(path_, "dataset " + name + " has type " + info.type + ", which meshtrain does not read as a tensor");
  }
  Tensor t = Tensor::empty(info.shape.empty() ? Shape{1} : info.shape, dt);
  if (t.numel() > 0) readRows(info, 0, info.shape.empty() ? 1 : info.shape[0], t.rawData());
  return t;
}

std::string H5File::readStringAttribute(const std::string& object, const std::string& attr) const {
  silenceHdf5();
  if (H5Aexists_by_name(file_.get(), object.c_str(), attr.c_str(), H5P_DEFAULT) <= 0) return "";
  H5Handle a(H5Aopen_by_name(file_.get(), object.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Handle t(H5Aget_type(a.get()), H5Tclose);
  if (H5Tget_class(t.get()) != H5T_STRING) return "";
  if (H5Tis_variable_str(t.get()) > 0) {
    char* s = nullptr;
    H5Handle mt(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mt.get(), H5T_VARIABLE);
    H5Tset_cset(mt.get(), H5Tget_cset(t.get()));  // h5py writes UTF-8
    if (H5Aread(a.get(), mt.get(), &s) < 0 || !s) return "";
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  size_t n = H5Tget_size(t.get());
  std::string out(n, '\0');
  H5Aread(a.get(), t.get(), out.data());
  out.resize(std::strlen(out.c_str()));
  return out;
}

int64_t H5File::readIntAttribute(const std::string& object, const std::string& attr, int64_t fallback) const {
  silenceHdf5();
  if (H5Aexists_by_name(file_.get(), object.c_str(), attr.c_str(), H5P_DEFAULT) <= 0) return fallback;
  const std::string where = "attribute " + attr + " of " + object;
  H5Handle a(H5Aopen_by_name(file_.get(), object.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) dataError(path_, where + " cannot be opened: " + detail::hdf5ErrorString());
  H5Handle t(H5Aget_type(a.get()), H5Tclose), space(H5Aget_space(a.get()), H5Sclose);
  size_t size = 0;
  bool littleEndian = true;
  const std::string type = typeNameOf(t.get(), &size, &littleEndian);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  // HDF5 would convert a float (10.7 -> 10) and read an array's first value into a one-value
  // buffer past its end; a string failed to read and the attribute was silently ignored.
  if (H5Tget_class(t.get()) != H5T_INTEGER || n != 1)
    dataError(path_, where + " is " + (n != 1 ? std::to_string(n) + " values of " : "of type ") + type +
                         ", expected one integer");
  if (type == "u64") {  // above 2^63 - 1, HDF5's conversion to int64 clips silently
    uint64_t u = 0;
    if (H5Aread(a.get(), H5T_NATIVE_UINT64, &u) < 0)
      dataError(path_, where + ": " + detail::hdf5ErrorString());
    if (u > static_cast<uint64_t>(INT64_MAX))
      dataError(path_, where + " = " + std::to_string(u) + " does not fit int64");
    return static_cast<int64_t>(u);
  }
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) dataError(path_, where + ": " + detail::hdf5ErrorString());
  return v;
}

int64_t H5File::readCountAttribute(const std::string& object, const std::string& attr, int64_t hi) const {
  silenceHdf5();
  for (const std::string& where : {object, std::string("/")}) {
    if (H5Aexists_by_name(file_.get(), where.c_str(), attr.c_str(), H5P_DEFAULT) <= 0) continue;
    const int64_t v = readIntAttribute(where, attr, 0);
    if (v < 1 || v > hi)
      dataError(path_, "attribute " + attr + " of " + where + " = " + std::to_string(v) + " is outside [1, " +
                           std::to_string(hi) + "]");
    return v;
  }
  return -1;
}

H5Writer::H5Writer(const std::string& path) : path_(path) {
  silenceHdf5();
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) throw IoError("cannot create " + path + ": " + detail::hdf5ErrorString());
  file_ = H5Handle(f, H5Fclose);
}

H5Writer::~H5Writer() {
  // Closing errors are reported by close(); here they can only be dropped.
  file_.reset();
}

void H5Writer::ensureGroups(const std::string& name) {
  size_t pos = 1;
  while ((pos = name.find('/', pos)) != std::string::npos) {
    std::string g = name.substr(0, pos);
    if (H5Lexists(file_.get(), g.c_str(), H5P_DEFAULT) <= 0) {
      H5Handle grp(H5Gcreate2(file_.get(), g.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      if (!grp.valid()) throw IoError("cannot create group " + g + " in " + path_ + ": " + detail::hdf5ErrorString());
    }
    ++pos;
  }
}

void H5Writer::write(const std::string& name, const Tensor& t, int64_t chunkRows, int deflateLevel) {
  silenceHdf5();
  MT_CHECK(t.device().isCpu() && t.isContiguous(), "H5Writer::write needs a contiguous CPU tensor: ", t.str());
  ensureGroups(name);
  std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
  if (dims.empty()) dims.push_back(1);
  H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (chunkRows > 0 && dims[0] > 0) {
    std::vector<hsize_t> cd = dims;
    cd[0] = std::min<hsize_t>(dims[0], static_cast<hsize_t>(chunkRows));
    H5_CHECK(H5Pset_chunk(dcpl.get(), static_cast<int>(cd.size()), cd.data()), path_);
    if (deflateLevel > 0) {
      H5_CHECK(H5Pset_shuffle(dcpl.get()), path_);
      H5_CHECK(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(deflateLevel)), path_);
    }
  }
  const hid_t type = h5NativeType(t.dtype());
  H5Handle d(H5Dcreate2(file_.get(), name.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
             H5Dclose);
  if (!d.valid()) throw IoError("cannot create dataset " + name + " in " + path_ + ": " + detail::hdf5ErrorString());
  if (t.numel() > 0 && H5Dwrite(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.rawData()) < 0)
    throw IoError("writing " + name + " to " + path_ + ": " + detail::hdf5ErrorString());
  writeStringAttribute(name, "dtype", dtypeName(t.dtype()));
}

void H5Writer::writeStringAttribute(const std::string& object, const std::string& attr, const std::string& value) {
  silenceHdf5();
  if (object != "/") ensureGroups(object + "/");
  H5Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t.get(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(t.get(), H5T_STR_NULLPAD);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists_by_name(file_.get(), object.c_str(), attr.c_str(), H5P_DEFAULT) > 0)
    H5Adelete_by_name(file_.get(), object.c_str(), attr.c_str(), H5P_DEFAULT);
  H5Handle a(H5Acreate_by_name(file_.get(), object.c_str(), attr.c_str(), t.get(), space.get(), H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
             H5Aclose);
  if (!a.valid() || H5Awrite(a.get(), t.get(), value.c_str()) < 0)
    throw IoError("writing attribute " + object + "@" + attr + " to " + path_ + ": " + detail::hdf5ErrorString());
}

void H5Writer::writeIntAttribute(const std::string& object, const std::string& attr, int64_t value) {
  silenceHdf5();
  if (object != "/") ensureGroups(object + "/");
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists_by_name(file_.get(), object.c_str(), attr.c_str(), H5P_DEFAULT) > 0)
    H5Adelete_by_name(file_.get(), object.c_str(), attr.c_str(), H5P_DEFAULT);
  H5Handle a(H5Acreate_by_name(file_.get(), object.c_str(), attr.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
             H5Aclose);
  if (!a.valid() || H5Awrite(a.get(), H5T_NATIVE_INT64, &value) < 0)
    throw IoError("writing attribute " + object + "@" + attr + " to " + path_ + ": " + detail::hdf5ErrorString());
}

void H5Writer::close() {
  silenceHdf5();
  if (!file_.valid()) return;
  if (H5Fflush(file_.get(), H5F_SCOPE_LOCAL) < 0) {
    std::string why = detail::hdf5ErrorString();
    file_.reset();
    throw IoError("flushing " + path_ + ": " + why);
  }
  // Ownership is released first so a failed close is not retried by the destructor.
  if (H5Fclose(file_.release()) < 0) throw IoError("closing " + path_ + ": " + detail::hdf5ErrorString());
}

}  // namespace mt

-- aapc.lua: a Wireshark/tshark dissector for the frames of aapc, the DPDK all-to-all
-- exchange engine (engine/wire/include/aapc/wire/wire.hpp has the wire format).
--
-- Frames are Ethernet frames of EtherType 0x88B5 (IEEE local experimental; change it under
-- Preferences > Protocols > AAPC, or `-o aapc.ethertype:34998` (decimal, here 0x88B6), when
-- the cluster was configured with another one; `-o aapc.verify_crc:FALSE` turns the CRC
-- check off) carrying a big-endian header and a payload. Every frame but DATA has this
-- 44-byte header:
--
--   offset size field                        filter name
--    0     2   magic 0xAA9C                   aapc.magic
--    2     1   version (5; 6, 7: tagged)      aapc.version
--    3     1   type                           aapc.type (DATA 1 .. JOIN 9)
--    4     1   flags                          aapc.flags, aapc.flags.retransmit/.dummy/.last/.ack_list
--    5     1   header length (44; DATA 30)    aapc.hdr_len
--    6     2   phase (0xFFFF: none)           aapc.phase
--    8     4   exchange id                    aapc.exchange
--   12     4   epoch of the sender            aapc.epoch
--   16     2   source rank                    aapc.src
--   18     2   destination rank               aapc.dst
--   20     4   seq                            aapc.seq
--   24     8   block length (JOIN: join round) aapc.block_len
--   32     2   payload length                 aapc.payload_len
--   34     2   chunk                          aapc.chunk
--   36     4   aux                            aapc.aux
--   40     4   CRC32C                         aapc.crc
--   44     n   payload                        aapc.payload
--  44+n   24   version 6, 7: tag              aapc.tag
--              a frame counter (8 bytes) and the ChaCha20-Poly1305 MAC (16) of header and
--              payload under the cluster key (not verified here: the dissector has no key)
--
-- DATA frames have a 30-byte header: bytes 0..23 as above (seq: the frame's index), then
--   24     2   payload length                 aapc.payload_len
--   26     4   CRC32C                         aapc.crc
--   30     n   payload                        aapc.payload
--  30+n   24   version 6, 7: tag              aapc.tag
-- (no block length, chunk nor aux: the receiver checks a frame against the block it posted).
--
-- Generated fields: aapc.ack_of (ACK: the type acknowledged, from aux), aapc.abort_code (ABORT: the reason
-- code, from aux), aapc.abort.reason (ABORT: the payload text), aapc.nack.first and
-- aapc.nack.count (one pair per NACK range), aapc.crc.computed, aapc.crc_ok (true/false
-- when the CRC could be checked) and aapc.crc_bad (present, true, only on a mismatch).
--
-- The CRC is CRC32C (Castagnoli) over the header's bytes before the CRC field (40, or 26
-- in DATA) and then the payload_len bytes of payload: the 4 bytes of the CRC field itself are
-- skipped, not fed as zeros (this is what seal() and decode() in engine/wire/src/wire.cpp do). It is checked only
-- when the capture holds the whole payload; captures made with the engine's default snap
-- length (64 bytes) hold the headers only, and get the note "CRC not verified: frame
-- truncated by the capture" instead of a verdict.
--
-- Problems are expert infos (`_ws.expert`, or Analyze > Expert Information):
--   aapc.expert.bad_crc         checksum/error  bad CRC32C
--   aapc.expert.crc_unverified  checksum/note   CRC not verified: frame truncated by the capture
--   aapc.expert.malformed       malformed/error bad magic, version, header length, payload
--                                               length beyond the frame, frame too short
--   aapc.expert.unknown_type    malformed/warn  type not 1..9
--
-- Install (per user; Wireshark and tshark load every .lua of this folder at start-up):
--   mkdir -p ~/.local/lib/wireshark/plugins
--   cp aapc.lua ~/.local/lib/wireshark/plugins/
-- (`ninja install` puts it in <prefix>/share/aapc/wireshark/aapc.lua; copy it from there.)
-- `tshark -G folders` shows the "Personal Lua Plugins" folder of this machine. Or load it
-- for one run only, without installing it (do not do both: a protocol cannot be
-- registered twice):
--   tshark -X lua_script:tools/wireshark/aapc.lua -r node0.pcap
--   tshark -X lua_script:aapc.lua -r node0.pcap -Y 'aapc.type == 1 && aapc.flags.retransmit'
--   tshark -X lua_script:aapc.lua -r node0.pcap -Y aapc.crc_bad
--   tshark -X lua_script:aapc.lua -r node0.pcap -T fields -e frame.number -e aapc.type \
--          -e aapc.src -e aapc.dst -e aapc.seq -E separator=,
--   wireshark -X lua_script:aapc.lua node0.pcap
--
-- As root: Wireshark refuses user Lua scripts (personal plugins folder and -X lua_script)
-- when it runs with privileges unless the global init.lua sets
-- `run_user_scripts_when_superuser = true`. The init.lua shipped with Wireshark 4.0 (Debian
-- 12: /usr/share/wireshark/init.lua) does set it, so `tshark -X lua_script:aapc.lua ...`
-- works as root as it is; tshark only prints the warning 'Running as user "root" and group
-- "root". This could be dangerous.' on stderr. For root, the personal plugins folder is
-- /root/.local/lib/wireshark/plugins ($HOME/.local/...). WIRESHARK_DATA_DIR (which could
-- point to another init.lua) is ignored when running as root, so where a site's init.lua
-- says false, run tshark as an ordinary user instead, e.g.
--   setpriv --reuid=nobody --regid=nogroup --clear-groups tshark -X lua_script:/path/aapc.lua -r file.pcap
-- (the script and the capture must be readable by that user).
--
-- Requires Wireshark >= 3.0 (Lua 5.2 with bit32; tested with tshark 4.0.17).

local aapc = Proto("aapc", "aapc all-to-all exchange")

local DEFAULT_ETHERTYPE = 0x88B5
local MAGIC = 0xAA9C
-- 1 and 2 before READY, SYNC and ACK carried exchange descriptors; 3 and 4 before DATA had
-- a header of its own
local VERSION = 5
local VERSION_AUTH = 6      -- frames of a cluster with a key: a 24-byte tag follows the payload
local VERSION_AUTH_GCM = 7  -- the same, the tag's MAC by AES-256-GCM instead of ChaCha20-Poly1305
local TAG_LEN = 24
local HEADER_LEN = 44       -- every frame but DATA
local DATA_HEADER_LEN = 30  -- DATA
local NO_PHASE = 0xFFFF

local TYPE_DATA, TYPE_SYNC, TYPE_READY, TYPE_NACK, TYPE_ACK = 1, 2, 3, 4, 5
local TYPE_ABORT, TYPE_POLL, TYPE_PING, TYPE_JOIN = 6, 7, 8, 9

-- frame_type_name() of engine/wire/src/wire.cpp
local type_names = {
  [1] = "DATA", [2] = "SYNC", [3] = "READY", [4] = "NACK", [5] = "ACK",
  [6] = "ABORT", [7] = "POLL", [8] = "PING", [9] = "JOIN",
}

-- errc_name() of engine/include/aapc/result.hpp: the reason codes of ABORT
local errc_names = {
  [0] = "ok", [1] = "invalid argument", [2] = "busy", [3] = "peer silent",
  [4] = "peer aborted", [5] = "timeout", [6] = "daemon restarted", [7] = "i/o error",
  [8] = "permission denied", [9] = "protocol error", [10] = "aborted", [11] = "internal error",
}

local FLAG_RETRANSMIT, FLAG_DUMMY, FLAG_LAST, FLAG_ACK_LIST = 0x01, 0x02, 0x04, 0x08

local f = {
  magic = ProtoField.uint16("aapc.magic", "Magic", base.HEX),
  version = ProtoField.uint8("aapc.version", "Version", base.DEC),
  type = ProtoField.uint8("aapc.type", "Type", base.DEC, type_names),
  flags = ProtoField.uint8("aapc.flags", "Flags", base.HEX),
  flag_retransmit = ProtoField.bool("aapc.flags.retransmit", "Retransmit", 8, nil, FLAG_RETRANSMIT,
    "A retransmission (after a NACK, a POLL answer or a timeout)"),
  flag_dummy = ProtoField.bool("aapc.flags.dummy", "Dummy", 8, nil, FLAG_DUMMY,
    "Dummy traffic: counted and dropped by the receiver"),
  flag_last = ProtoField.bool("aapc.flags.last", "Last", 8, nil, FLAG_LAST,
    "The last frame of a block's first transmission or of a burst of retransmissions: answer at once"),
  flag_ack_list = ProtoField.bool("aapc.flags.ack_list", "Ack list", 8, nil, FLAG_ACK_LIST,
    "An ACK whose payload lists acknowledgements of eager blocks and tokens, 20 bytes each"),
  hdr_len = ProtoField.uint8("aapc.hdr_len", "Header length", base.DEC),
  phase = ProtoField.uint16("aapc.phase", "Phase", base.DEC, { [NO_PHASE] = "none" }),
  exchange = ProtoField.uint32("aapc.exchange", "Exchange id", base.DEC),
  epoch = ProtoField.uint32("aapc.epoch", "Epoch", base.DEC),
  src = ProtoField.uint16("aapc.src", "Source rank", base.DEC),
  dst = ProtoField.uint16("aapc.dst", "Destination rank", base.DEC),
  seq = ProtoField.uint32("aapc.seq", "Seq", base.DEC,
    nil, nil, "DATA: frame index; SYNC and ACK of SYNC: sync id; NACK: number of ranges; JOIN: proposed exchange id"),
  block_len = ProtoField.uint64("aapc.block_len", "Block length", base.DEC),
  payload_len = ProtoField.uint16("aapc.payload_len", "Payload length", base.DEC),
  chunk = ProtoField.uint16("aapc.chunk", "Chunk", base.DEC, nil, nil, "Payload bytes of every full DATA frame of the block"),
  aux = ProtoField.uint32("aapc.aux", "Aux", base.DEC, nil, nil, "ACK: the type acknowledged; ABORT: a reason code"),
  crc = ProtoField.uint32("aapc.crc", "CRC32C", base.HEX),
  -- generated
  ack_of = ProtoField.uint32("aapc.ack_of", "Acknowledges", base.DEC, type_names),
  abort_code = ProtoField.uint32("aapc.abort_code", "Abort reason code", base.DEC, errc_names),
  abort_reason = ProtoField.string("aapc.abort.reason", "Abort reason"),
  nack_range = ProtoField.none("aapc.nack.range", "Missing range"),
  nack_first = ProtoField.uint32("aapc.nack.first", "First missing frame", base.DEC),
  nack_count = ProtoField.uint32("aapc.nack.count", "Frames missing", base.DEC),
  join_fill = ProtoField.uint32("aapc.join.fill", "Phases' fill (millionths)", base.DEC, nil, nil,
    "JOIN: the rate the sender's tree exchanges moved their blocks at, of the rate the model gives them"),
  join_hand_over = ProtoField.uint32("aapc.join.hand_over", "Hand-over per phase (ns)", base.DEC),
  join_reach = ProtoField.uint16("aapc.join.reach", "Reach (ten-thousandths of the limit)", base.DEC, nil, nil,
    "JOIN: what one exchange of a schedule that auto weighs reached, at one octave of block sizes (sched::reach_cell)"),
  payload = ProtoField.bytes("aapc.payload", "Payload"),
  tag = ProtoField.bytes("aapc.tag", "Tag (frame counter, MAC under the cluster key: ChaCha20-Poly1305 in version 6, AES-256-GCM in 7)"),
  crc_computed = ProtoField.uint32("aapc.crc.computed", "Computed CRC32C", base.HEX),
  crc_ok = ProtoField.bool("aapc.crc_ok", "CRC32C good"),
  crc_bad = ProtoField.bool("aapc.crc_bad", "CRC32C bad"),
}
aapc.fields = {
  f.magic, f.version, f.type, f.flags, f.flag_retransmit, f.flag_dummy, f.flag_last, f.flag_ack_list, f.hdr_len,
  f.phase, f.exchange, f.epoch, f.src, f.dst, f.seq, f.block_len, f.payload_len, f.chunk, f.aux,
  f.crc, f.ack_of, f.abort_code, f.abort_reason, f.nack_range, f.nack_first,
  f.nack_count, f.join_fill, f.join_hand_over, f.join_reach, f.payload, f.tag, f.crc_computed, f.crc_ok, f.crc_bad,
}

local ex = {
  bad_crc = ProtoExpert.new("aapc.expert.bad_crc", "bad CRC32C", expert.group.CHECKSUM, expert.severity.ERROR),
  crc_unverified = ProtoExpert.new("aapc.expert.crc_unverified", "CRC not verified: frame truncated by the capture",
    expert.group.CHECKSUM, expert.severity.NOTE),
  malformed = ProtoExpert.new("aapc.expert.malformed", "malformed aapc frame", expert.group.MALFORMED, expert.severity.ERROR),
  unknown_type = ProtoExpert.new("aapc.expert.unknown_type", "unknown frame type", expert.group.MALFORMED, expert.severity.WARN),
}
aapc.experts = { ex.bad_crc, ex.crc_unverified, ex.malformed, ex.unknown_type }

aapc.prefs.ethertype = Pref.uint("EtherType", DEFAULT_ETHERTYPE, "The EtherType of aapc frames, in decimal (the engine's default is 34997 = 0x88B5)")
aapc.prefs.verify_crc = Pref.bool("Verify CRC32C", true, "Check the CRC32C of frames captured whole")

-- CRC32C (Castagnoli): reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF.
local band, bxor, rshift, bnot = bit32.band, bit32.bxor, bit32.rshift, bit32.bnot
local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if band(c, 1) ~= 0 then c = bxor(rshift(c, 1), 0x82F63B78) else c = rshift(c, 1) end
  end
  crc_table[i] = c
end

-- Continues a CRC over the bytes of a Lua string; start with crc32c_update(0xFFFFFFFF, ...)
-- and finish with bnot().
local function crc32c_update(crc, s)
  local byte = string.byte
  for i = 1, #s do
    crc = bxor(crc_table[band(bxor(crc, byte(s, i)), 0xFF)], rshift(crc, 8))
  end
  return crc
end

local function flag_text(flags)
  local out = {}
  if band(flags, FLAG_RETRANSMIT) ~= 0 then out[#out + 1] = "RETRANSMIT" end
  if band(flags, FLAG_DUMMY) ~= 0 then out[#out + 1] = "DUMMY" end
  if band(flags, FLAG_LAST) ~= 0 then out[#out + 1] = "LAST" end
  if band(flags, FLAG_ACK_LIST) ~= 0 then out[#out + 1] = "ACK_LIST" end
  if #out == 0 then return "" end
  return " [" .. table.concat(out, ",") .. "]"
end

function aapc.dissector(tvb, pinfo, tree)
  local captured = tvb:len()                  -- bytes in the capture
  local reported = tvb:reported_length_remaining() -- bytes the frame had on the wire
  if reported < 0 then reported = captured end
  pinfo.cols.protocol:set("AAPC")

  -- The header's length goes with the type (DATA has the short one).
  local is_data = captured >= 4 and tvb(3, 1):uint() == TYPE_DATA
  local hlen = is_data and DATA_HEADER_LEN or HEADER_LEN
  local root = tree:add(aapc, tvb(0, math.min(captured, hlen)))

  if reported < hlen then
    root:add_proto_expert_info(ex.malformed, string.format("frame too short: %d bytes after the Ethernet header, the aapc header has %d", reported, hlen))
    pinfo.cols.info:set(string.format("aapc frame too short (%d bytes)", reported))
    if captured > 0 then root:add(f.payload, tvb(0, captured)) end
    return captured
  end
  if captured < hlen then
    -- The capture kept less than the header: decode what is there.
    local fields = {
      { 0, 2, f.magic }, { 2, 1, f.version }, { 3, 1, f.type }, { 4, 1, f.flags }, { 5, 1, f.hdr_len },
      { 6, 2, f.phase }, { 8, 4, f.exchange }, { 12, 4, f.epoch }, { 16, 2, f.src }, { 18, 2, f.dst },
      { 20, 4, f.seq },
    }
    local rest = is_data and { { 24, 2, f.payload_len }, { 26, 4, f.crc } }
      or { { 24, 8, f.block_len }, { 32, 2, f.payload_len }, { 34, 2, f.chunk }, { 36, 4, f.aux }, { 40, 4, f.crc } }
    for _, d in ipairs(rest) do fields[#fields + 1] = d end
    for _, d in ipairs(fields) do
      if d[1] + d[2] <= captured then root:add(d[3], tvb(d[1], d[2])) end
    end
    root:add_proto_expert_info(ex.crc_unverified, "CRC not verified: frame truncated by the capture (header incomplete)")
    pinfo.cols.info:set("aapc header truncated by the capture")
    return captured
  end

  local magic = tvb(0, 2):uint()
  local version = tvb(2, 1):uint()
  local ftype = tvb(3, 1):uint()
  local flags = tvb(4, 1):uint()
  local hdr_len = tvb(5, 1):uint()
  local exchange = tvb(8, 4):uint()
  local src = tvb(16, 2):uint()
  local dst = tvb(18, 2):uint()
  local seq = tvb(20, 4):uint()
  local payload_at = is_data and 24 or 32
  local crc_at = hlen - 4
  local payload_len = tvb(payload_at, 2):uint()
  local block_len = not is_data and tvb(24, 8):uint64() or nil
  local aux = not is_data and tvb(36, 4):uint() or 0
  local crc = tvb(crc_at, 4):uint()

  local tname = type_names[ftype]
  root:append_text(string.format(", %s, %d -> %d, exchange %d", tname or ("type " .. ftype), src, dst, exchange))

  local problems = {}
  local item = root:add(f.magic, tvb(0, 2))
  if magic ~= MAGIC then
    item:add_proto_expert_info(ex.malformed, string.format("bad magic 0x%04x (expected 0x%04x)", magic, MAGIC))
    problems[#problems + 1] = "bad magic"
  end
  item = root:add(f.version, tvb(2, 1))
  if version ~= VERSION and version ~= VERSION_AUTH and version ~= VERSION_AUTH_GCM then
    item:add_proto_expert_info(ex.malformed, string.format("bad version %d (expected %d, or %d or %d when tagged)", version, VERSION, VERSION_AUTH, VERSION_AUTH_GCM))
    problems[#problems + 1] = "bad version"
  end
  item = root:add(f.type, tvb(3, 1))
  if not tname then
    item:add_proto_expert_info(ex.unknown_type, string.format("unknown frame type %d", ftype))
    problems[#problems + 1] = "unknown type"
  end
  local flags_item = root:add(f.flags, tvb(4, 1))
  flags_item:append_text(flag_text(flags))
  flags_item:add(f.flag_retransmit, tvb(4, 1))
  flags_item:add(f.flag_dummy, tvb(4, 1))
  flags_item:add(f.flag_last, tvb(4, 1))
  flags_item:add(f.flag_ack_list, tvb(4, 1))
  item = root:add(f.hdr_len, tvb(5, 1))
  if hdr_len ~= hlen then
    item:add_proto_expert_info(ex.malformed, string.format("bad header length %d (expected %d)", hdr_len, hlen))
    problems[#problems + 1] = "bad header length"
  end
  root:add(f.phase, tvb(6, 2))
  root:add(f.exchange, tvb(8, 4))
  root:add(f.epoch, tvb(12, 4))
  root:add(f.src, tvb(16, 2))
  root:add(f.dst, tvb(18, 2))
  root:add(f.seq, tvb(20, 4))
  local aux_item
  if not is_data then
    local bl_item = root:add(f.block_len, tvb(24, 8))
    if ftype == TYPE_JOIN then bl_item:append_text(" (JOIN: the sender's join round)") end
  end
  local plen_item = root:add(f.payload_len, tvb(payload_at, 2))
  if not is_data then
    root:add(f.chunk, tvb(34, 2))
    aux_item = root:add(f.aux, tvb(36, 4))
  end
  local crc_item = root:add(f.crc, tvb(crc_at, 4))

  -- The payload (and the tag of versions 6 and 7): within the frame as sent, and how much of it the
  -- capture holds.
  local tag_len = (version == VERSION_AUTH or version == VERSION_AUTH_GCM) and TAG_LEN or 0
  local payload_fits = hlen + payload_len + tag_len <= reported
  if not payload_fits then
    plen_item:add_proto_expert_info(ex.malformed, string.format("payload length %d%s beyond the frame (%d bytes after the header)",
      payload_len, tag_len > 0 and " and tag" or "", reported - hlen))
    problems[#problems + 1] = "payload length beyond the frame"
  end
  local payload_captured = math.max(0, math.min(payload_len, captured - hlen))
  local whole = payload_fits and hlen + payload_len <= captured

  -- Type-specific decoding.
  local info_extra = ""
  if ftype == TYPE_DATA then
    info_extra = string.format(" frame %d", seq)
  elseif ftype == TYPE_SYNC then
    info_extra = string.format(" id %d", seq)
  elseif ftype == TYPE_NACK then
    local ranges = root:add(f.nack_range, tvb(hlen, payload_captured))
    ranges:set_text(string.format("Missing ranges: %d", seq))
    local shown, missing = 0, 0
    local first_missing
    for i = 0, seq - 1 do
      local at = hlen + 8 * i
      if at + 8 > hlen + payload_captured then break end
      local first, count = tvb(at, 4):uint(), tvb(at + 4, 4):uint()
      local r = ranges:add(f.nack_range, tvb(at, 8))
      r:set_text(string.format("Range %d: frames %d..%d (%d)", i, first, first + count - 1, count))
      r:add(f.nack_first, tvb(at, 4))
      r:add(f.nack_count, tvb(at + 4, 4))
      shown = shown + 1
      missing = missing + count
      first_missing = first_missing or first
    end
    if payload_fits and payload_len ~= seq * 8 then
      plen_item:add_proto_expert_info(ex.malformed, string.format("NACK of %d ranges has %d payload bytes (expected %d)", seq, payload_len, seq * 8))
      problems[#problems + 1] = "bad NACK length"
    end
    info_extra = string.format(" ranges %d", seq)
    if shown > 0 then
      info_extra = info_extra .. string.format(" missing %d from frame %d", missing, first_missing)
    end
    if shown < seq and captured < reported then info_extra = info_extra .. " (ranges truncated by the capture)" end
  elseif ftype == TYPE_ACK then
    root:add(f.ack_of, aux):set_generated()
    aux_item:append_text(" (" .. (type_names[aux] or "?") .. ")")
    info_extra = " of " .. (type_names[aux] or ("type " .. aux))
    if aux == TYPE_SYNC then info_extra = info_extra .. string.format(" id %d", seq) end
    if aux == TYPE_JOIN then info_extra = info_extra .. string.format(" id %d", seq) end
  elseif ftype == TYPE_ABORT then
    root:add(f.abort_code, aux):set_generated()
    aux_item:append_text(" (" .. (errc_names[aux] or "?") .. ")")
    local text = ""
    if payload_captured > 0 then
      text = tvb(hlen, payload_captured):string()
      root:add(f.abort_reason, tvb(hlen, payload_captured))
    end
    info_extra = string.format(" (%s) \"%s\"", errc_names[aux] or ("code " .. aux), text)
  elseif ftype == TYPE_POLL then
    info_extra = " block " .. tostring(block_len)
  elseif ftype == TYPE_JOIN then
    info_extra = string.format(" id %d", seq)
    -- What the sender measured (JoinMeasure: its tree exchanges' fit, then reaches of 7 bytes:
    -- exchange, cell, ten-thousandths of the limit), or nothing.
    if payload_len >= 8 and (payload_len - 8) % 7 == 0 and payload_captured >= payload_len then
      local fill, hand_over = tvb(hlen, 4):uint(), tvb(hlen + 4, 4):uint()
      root:add(f.join_fill, tvb(hlen, 4))
      root:add(f.join_hand_over, tvb(hlen + 4, 4))
      local reaches = (payload_len - 8) / 7
      for i = 0, reaches - 1 do
        local at = hlen + 8 + 7 * i
        root:add(f.join_reach, tvb(at + 5, 2)):append_text(string.format(" (exchange %d, cell %d)", tvb(at, 4):uint(), tvb(at + 4, 1):uint()))
      end
      info_extra = info_extra .. string.format(" fill %.1f%% hand-over %.1f us reaches %d", fill / 1e4, hand_over / 1e3, reaches)
    end
  end
  if payload_captured > 0 and ftype ~= TYPE_NACK and ftype ~= TYPE_ABORT then
    root:add(f.payload, tvb(hlen, payload_captured))
  end
  if tag_len > 0 and payload_fits and hlen + payload_len + tag_len <= captured then
    root:add(f.tag, tvb(hlen + payload_len, tag_len))
  end

  -- CRC32C over the header's bytes before the CRC and the payload.
  local crc_note = ""
  if aapc.prefs.verify_crc and payload_fits then
    if whole then
      local c = crc32c_update(0xFFFFFFFF, tvb(0, crc_at):raw())
      if payload_len > 0 then c = crc32c_update(c, tvb(hlen, payload_len):raw()) end
      c = bnot(c)
      root:add(f.crc_computed, c):set_generated()
      if c == crc then
        crc_item:append_text(" [correct]")
        root:add(f.crc_ok, true):set_generated()
      else
        crc_item:append_text(string.format(" [incorrect, should be 0x%08x]", c))
        root:add(f.crc_ok, false):set_generated()
        local bad = root:add(f.crc_bad, true):set_generated()
        bad:add_proto_expert_info(ex.bad_crc, string.format("bad CRC32C: 0x%08x in the frame, 0x%08x computed", crc, c))
        crc_note = " [BAD CRC]"
      end
    else
      crc_item:append_text(" [not verified]")
      crc_item:add_proto_expert_info(ex.crc_unverified)
    end
  end

  local info = string.format("%s %d->%d ex %d%s%s%s", tname or ("type " .. ftype), src, dst, exchange, info_extra, flag_text(flags), crc_note)
  if #problems > 0 then info = info .. " [MALFORMED: " .. table.concat(problems, ", ") .. "]" end
  pinfo.cols.info:set(info)
  -- What follows header and payload (Ethernet padding of short frames) is the Ethernet
  -- dissector's trailer.
  if payload_fits then return math.min(captured, hlen + payload_len + tag_len) end
  return captured
end

local registered_ethertype
local function register()
  local t = DissectorTable.get("ethertype")
  if registered_ethertype then t:remove(registered_ethertype, aapc) end
  registered_ethertype = aapc.prefs.ethertype
  t:add(registered_ethertype, aapc)
end

function aapc.prefs_changed()
  if registered_ethertype ~= aapc.prefs.ethertype then register() end
end

register()

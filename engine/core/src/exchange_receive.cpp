// What an exchange receives: data into the posted block, NACKs, and its control frames.
#include "exchange.hpp"

#include "aapc/wire/crc.hpp"

namespace aapc::engine {

void Exchange::on_data(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  InBlock& in = in_[idx(src)];
  ready_acked(src);  // data from a peer means it has our READY
  if (in.complete || test_bit(in.bits, f.h.seq)) {
    count_drop(DropReason::kDuplicate);
    if ((f.h.flags & kFlagLast) != 0 && in.complete) link_.send_control(src, FrameType::kAck, spec_.id, 0, static_cast<std::uint32_t>(FrameType::kData), in.len);
    return;
  }
  if (!f.placed) copy_ahead(in.data + f.offset, f.payload.data(), f.payload.size(), counters_.streamed ? Ahead::kStream : Ahead::kDestination);  // else parse() copied it
  set_bit(in.bits, f.h.seq);
  ++in.got;
  last_progress_ = now;
  ++counters_.data_frames_received;
  counters_.data_bytes_received += f.payload.size();
  if (in.got == in.frames) {
    block_complete(src, now);
  } else if ((f.h.flags & kFlagLast) != 0) {
    send_nack(src, in);  // the sender's first pass, or a burst of resent frames, ended with holes
  }
}

void Exchange::block_complete(Rank src, Clock::time_point now) {
  InBlock& in = in_[idx(src)];
  in.complete = true;
  --incomplete_blocks_;
  if (staging_) unpack_from(src);
  if (in.eager) {
    link_.ack_later(src, {spec_.id, FrameType::kData, 0, in.len}, now);  // its sender does not wait for it
  } else {
    link_.send_control(src, FrameType::kAck, spec_.id, 0, static_cast<std::uint32_t>(FrameType::kData), in.len);
    ++counters_.control_frames_sent;
  }
  // Receiver-based tokens: emitted once the whole block is here.
  if (const auto* ids = spec_.program.emits_on_receive(src))
    for (std::uint32_t id : *ids) emit(id, now);
  advance(now);
}

void Exchange::send_nack(Rank src, InBlock& in) {
  // No rate limit is needed: NACKs answer a poll, or the first arrival of a frame that ends a
  // burst (kFlagLast), and each burst answers a NACK. (One NACK per half RTO held back the
  // answer to a burst that came back within that time, which it always does on a LAN.)
  const std::size_t max_ranges = link_.control_room() / 8;  // a NACK fits a control frame's payload
  std::vector<std::uint8_t> payload;
  std::uint32_t ranges = 0;
  std::uint32_t f = 0;
  while (f < in.frames && ranges < max_ranges) {
    if (test_bit(in.bits, f)) {
      ++f;
      continue;
    }
    std::uint32_t first = f;
    while (f < in.frames && !test_bit(in.bits, f)) ++f;
    payload.resize(payload.size() + 8);
    put_nack_range(payload.data(), ranges, first, f - first);
    ++ranges;
  }
  link_.send_control(src, FrameType::kNack, spec_.id, ranges, 0, in.len, payload.data(), payload.size());
  ++counters_.nacks_sent;
  ++counters_.control_frames_sent;
}

void Exchange::on_nack(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  ++counters_.nacks_received;
  int o = out_of_[idx(src)];
  if (o < 0 || out_[static_cast<std::size_t>(o)].len != f.h.block_len || (!running() && !settling_)) {
    count_drop(DropReason::kUnexpectedBlock);
    return;
  }
  OutBlock& b = out_[static_cast<std::size_t>(o)];
  if (b.acked || f.h.chunk != link_.chunk()) return;
  bool was_empty = b.resend.empty();
  for (std::uint32_t i = 0; i < f.h.seq; ++i) {
    auto [first, count] = nack_range(f.payload, i);
    for (std::uint32_t x = first; x < first + count; ++x) {
      // Only frames already sent once: the first pass will still bring the others.
      if (x < b.sent && !test_bit(b.queued, x)) {
        set_bit(b.queued, x);
        b.resend.push_back(x);
      }
    }
  }
  if (was_empty && !b.resend.empty()) resend_blocks_.push_back(o);
  // The receiver answers: only polls in a row that get no answer count towards giving up,
  // and back off. (At 30% loss per port direction, 41 polls in all were used up by a block
  // that kept making progress; and a block whose polls had backed off to rto_max
  // before this answer went on polling every 500 ms while each round trip failed 88% of the
  // time.)
  b.polls = 0;
  b.rto = link_.config().rto;
  b.poll_at = now + b.rto;
}

void Exchange::on_ack(Rank src, FrameType acked, std::uint32_t seq, std::uint64_t block_len, Clock::time_point now) {
  if (acked == FrameType::kData) {
    int o = out_of_[idx(src)];
    if (o >= 0 && out_[static_cast<std::size_t>(o)].len == block_len && !out_[static_cast<std::size_t>(o)].acked) {
      out_[static_cast<std::size_t>(o)].acked = true;
      --unacked_blocks_;
      last_progress_ = now;
    }
  } else if (acked == FrameType::kReady) {
    ready_acked(src);
    last_progress_ = now;
  } else if (acked == FrameType::kSync) {
    auto it = syncs_out_.find(seq);
    if (it != syncs_out_.end() && it->second.to == src) {
      syncs_out_.erase(it);
      --unacked_pending_;
      last_progress_ = now;
    }
  }
}

void Exchange::on_acks(Rank src, const AckEntry& e, Clock::time_point now) {
  on_ack(src, e.type, e.seq, e.block_len, now);
  advance(now);
}

void Exchange::on_control(const Parsed& f, Clock::time_point now) {
  const Rank src = f.src_rank;
  ++counters_.control_frames_received;
  const bool described = f.h.type == FrameType::kReady || f.h.type == FrameType::kSync || f.h.type == FrameType::kAck;
  if (described && !agrees(src, f.payload, f.h.type, now)) return;
  switch (f.h.type) {
    case FrameType::kReady:
      if (!f.payload.empty() && !expects_ours(src, f.h.block_len, now)) return;
      if (running() && !ready_from_[idx(src)]) {
        ready_from_[idx(src)] = true;
        last_progress_ = now;
      }
      ack(src, FrameType::kReady, 0);
      break;
    case FrameType::kSync:
      if (f.h.seq >= have_sync_.size()) {
        count_drop(DropReason::kBadLength);
        return;
      }
      if (have_sync_[f.h.seq] == 0) last_progress_ = now;
      have_sync_[f.h.seq] = 1;
      if (running()) {
        link_.ack_later(src, {spec_.id, FrameType::kSync, f.h.seq, 0}, now);  // its emitter does not wait for it
      } else {
        ack(src, FrameType::kSync, f.h.seq);
      }
      break;
    case FrameType::kAck:
      on_ack(src, static_cast<FrameType>(f.h.aux), f.h.seq, f.h.block_len, now);
      break;
    case FrameType::kNack:
      on_nack(f, now);
      break;
    case FrameType::kPoll: {
      InBlock& in = in_[idx(src)];
      if (in.len != f.h.block_len) {
        // The sender's block is of another length. Its DATA frames do not say so (only the
        // last of its first pass does, and that one may be lost): its polls do.
        count_drop(DropReason::kUnexpectedBlock);
        unexpected_data(src, f.h.block_len, now);
        return;
      }
      if (in.complete) {
        link_.send_control(src, FrameType::kAck, spec_.id, 0, static_cast<std::uint32_t>(FrameType::kData), in.len);
      } else if (running()) {
        send_nack(src, in);
      }
      break;
    }
    default:
      break;
  }
  advance(now);
}

}  // namespace aapc::engine
